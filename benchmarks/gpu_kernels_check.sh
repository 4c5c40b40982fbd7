#!/usr/bin/env bash
# GPU checks of kernels/ on one GPU, from the repository root:
#   benchmarks/gpu_kernels_check.sh                  the GPU kernel tests + the benchmark's smoke run
#   BASE=HEAD~1 benchmarks/gpu_kernels_check.sh      ... + every result of kernels/ compared,
#                                                    bitwise, with BASE's kernels/ on the same data
#   OLD_KERNELS=DIR benchmarks/gpu_kernels_check.sh  the same against DIR/kernels (no git needed)
# The comparison goes through the public API only (threshold selection by both launch
# paths, exact top-k by the one-block kernel and the radix select with and without its
# host read, k-th magnitude, capping, Gaussiank, coo_sum, scatter_add), so any two
# versions of kernels/ can be compared.  SANITIZE=1 also runs the smoke run under
# compute-sanitizer (memcheck, racecheck).  Exit status: 0 when everything passed.
set -u
PY=${PY:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
fail=0

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
$PY -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)"

step "GPU kernel tests"
$PY -m pytest -q -p no:cacheprovider -o addopts="" tests/test_gpu_kernels.py tests/test_kernels.py \
  || fail=1

step "benchmark smoke run"
$PY tests/benchmarks/gpu_kernels.py --smoke || fail=1
if [ "${SANITIZE:-0}" = 1 ]; then
  for tool in memcheck racecheck; do
    step "compute-sanitizer --tool $tool, smoke run"
    compute-sanitizer --tool $tool --error-exitcode 9 $PY tests/benchmarks/gpu_kernels.py --smoke \
      | tail -3 || fail=1
  done
fi

old=""
if [ -n "${OLD_KERNELS:-}" ]; then
  old=$(mktemp -d) && cp -r "$OLD_KERNELS/kernels" "$old/"
elif [ -n "${BASE:-}" ]; then
  old=$(mktemp -d) && git archive "$BASE" kernels | tar -x -C "$old"
fi
if [ -n "$old" ]; then
  step "kernels/ results against ${BASE:-$OLD_KERNELS}, bitwise"
  golden=$(cat <<'EOF'
import hashlib, json, sys
sys.path.insert(0, sys.argv[1])
import cupy as cp
import numpy as np
import kernels
assert kernels.__file__.startswith(sys.argv[1]), kernels.__file__
out = {}

def put(name, *arrays):
    h = hashlib.sha256()
    for a in arrays:
        a = cp.asnumpy(a) if isinstance(a, cp.ndarray) else np.asarray(a)
        h.update(str((a.dtype.str, a.shape)).encode() + np.ascontiguousarray(a).tobytes())
    out[name] = h.hexdigest()

def data(dist, n, rng):
    if dist == "gaussian":
        return rng.standard_normal(n, dtype=np.float32)
    if dist == "t2":
        return rng.standard_t(2, n).astype(np.float32)
    if dist == "ties":
        return rng.integers(-3, 4, n).astype(np.float32)
    x = (1e-3 * rng.standard_normal(n)).astype(np.float32)           # "hot"
    w = max(1, n // 50)
    s = int(rng.integers(0, n - w + 1))
    x[s:s + w] = 10 * rng.standard_normal(w).astype(np.float32)
    return x

sizes = [1, 1000, 8193, 16384, 16385, 262144, 262145, 300007, (1 << 22) + 3, 1 << 24,
         (1 << 24) + 12345, 1 << 26]
for dist in ("gaussian", "t2", "ties", "hot"):
    for n in sizes:
        if n >= 1 << 26 and dist in ("ties", "hot"):
            continue
        rng = np.random.default_rng([n, len(dist)])
        xg = cp.asarray(data(dist, n, rng))
        c = f"{dist} n={n}"
        for d in (0.01, 0.001):
            k = kernels.k_from_density(n, d)
            put(f"{c} kth k={k}", kernels.kth_magnitude(xg, k))
            t = kernels.kth_magnitude(xg, k)
            for rep in range(2):        # the second call sized by the first's count
                put(f"{c} thr t={t!r} call {rep}", *kernels.threshold_select(xg, t))
            put(f"{c} thr f64 t={t!r}", *kernels.threshold_select(xg, np.float64(t) * (1 + 1e-9)))
            put(f"{c} gaussian d={d}", *kernels.gaussian_select(xg, k, d))
            if k < n:
                put(f"{c} topk k={k}", *kernels.topk_select(xg, k))
        for k in sorted({1, n // 2, n - 1} - {0}):
            if k < n:
                put(f"{c} topk k={k}", *kernels.topk_select(xg, k))
        put(f"{c} thr 0", *kernels.threshold_select(xg, 0.0))
        if n <= 1 << 22:                # COO sets: capping, sums, scatter-add
            idx = cp.asarray(np.sort(rng.choice(1 << 30, n, replace=False)).astype(np.int32))
            for k in sorted({1, max(1, n // 3), n - 1} - {0}):
                if k < n:
                    put(f"{c} cap k={k}", *kernels.cap_selection(idx, xg, k))
            sets = [cp.asarray(np.sort(rng.choice(2 * n, n // 2 + 1, replace=False)).astype(np.int32))
                    for _ in range(4)]
            vals = [cp.asarray(rng.standard_normal(s.size).astype(np.float32)) for s in sets]
            put(f"{c} coo_sum f32", *kernels.coo_sum(sets, vals, 2 * n))
            put(f"{c} coo_sum f64", *kernels.coo_sum(sets, [v.astype(cp.float64) for v in vals]))
            ri = cp.asarray(rng.integers(0, max(1, n // 7), 3 * n).astype(np.int32))
            rv = cp.asarray(rng.standard_normal(3 * n).astype(np.float32))
            put(f"{c} coo_sum repeats", *kernels.coo_sum(ri, rv))
            dense = xg.copy()
            put(f"{c} scatter_add", kernels.scatter_add(dense, ri, rv))
json.dump(out, open(sys.argv[2], "w"), indent=0, sort_keys=True)
print(f"{len(out)} results from {kernels.__file__}")
EOF
)
  tmp=$(mktemp -d)
  $PY -c "$golden" "$old" "$tmp/old.json" && $PY -c "$golden" "$PWD" "$tmp/new.json" \
    && $PY - "$tmp/old.json" "$tmp/new.json" <<'EOF' || fail=1
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
print(f"{len(a)} results compared: " + ("all bitwise equal" if not diff else
      f"{len(diff)} DIFFER: " + "; ".join(diff[:20])))
sys.exit(1 if diff else 0)
EOF
fi

step "done: $([ $fail = 0 ] && echo all passed || echo FAILURES above)"
exit $fail
