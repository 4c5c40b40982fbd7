#!/usr/bin/env bash
# GPU checks and benchmarks in one go, on a machine with NP >= 2 GPUs (the
# lent GPU machine has system Open MPI, cupy with NCCL, torch).  Run from the
# repository root:  NP=2 OUT=/tmp/out STAGES="conf bench profile" benchmarks/gpu_suite.sh
# Writes JSON results under $OUT (bench_*.json, profile_*.json, scaling_*.json) and logs to
# stdout.  STAGES="profile train" profiles NVLink and sockets through NCCL, then trains
# the digits CNN over NCCL (train_digits_nccl_P*.json).  STAGES="step": issue #25's per-call
# and training-step figures (call_latency_P*.json, train_step_<network>_P*.json).  STAGES="scaling" runs the CPU-rank scaling study alone (no GPU needed).
set -u
# the same settings as benchmarks/__init__.py's NVLS_OFF_ENV and NCCL_SOCKETS_ENV (SOCK below)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/gpu_suite}; mkdir -p "$OUT"
NP=${NP:-2}
STAGES=${STAGES:-"conf bench profile"}
LOG2N=${LOG2N:-20:28}
PY=${PY:-python3}
MPI=(mpirun --allow-run-as-root --oversubscribe --bind-to none -n "$NP"
     -x NCCL_NVLS_ENABLE -x PYTHONPATH -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS)
SOCK=(-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_NET=Socket -x NCCL_SOCKET_IFNAME=lo)
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

step "machine"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
nvidia-smi topo -m 2>/dev/null | head -8
$PY -c "import cupy, torch, mpi4py, numpy; from cupy.cuda import nccl; print('cupy', cupy.__version__, 'torch', torch.__version__, 'mpi4py', mpi4py.__version__, 'numpy', numpy.__version__, 'nccl', nccl.get_version())"

for s in $STAGES; do case $s in
conf)
  # CONF_ALGOS: a comma list (name or name@key=value) instead of every algorithm and variant
  ca=(); [ -n "${CONF_ALGOS:-}" ] && ca=(--algorithms "$CONF_ALGOS")
  step "conformance NCCL + cupy, P=$NP"
  "${MPI[@]}" $PY -m tests.mpi.conformance --backend nccl --array cupy "${ca[@]}"
  step "conformance NCCL + torch (DLPack), P=$NP"
  "${MPI[@]}" $PY -m tests.mpi.conformance --backend nccl --array torch --quick "${ca[@]}"
  step "conformance MPI + cupy (staged or CUDA-aware), P=$NP"
  "${MPI[@]}" $PY -m tests.mpi.conformance --backend mpi --array cupy --quick "${ca[@]}"
  step "auto without a profile on NCCL, P=$NP"
  "${MPI[@]}" $PY -m tests.mpi.dispatch_checks --backend nccl
  step "one bad rank, call cases on device arrays (NCCL + cupy), P=$NP"
  "${MPI[@]}" $PY -m tests.mpi.one_rank_checks --array cupy | tail -3
  step "half-precision inputs (cupy float16, torch CUDA float16 / bfloat16), NCCL and MPI, P=$NP"
  "${MPI[@]}" $PY -m tests.mpi.half_checks --backend nccl --array gpu
  "${MPI[@]}" $PY -m tests.mpi.half_checks --backend mpi --array gpu
  ;;
gpukernels)
  # the GPU kernel tests and the kernel benchmark's smoke run (benchmarks/gpu_kernels_check.sh;
  # BASE=REV there also compares every kernel result with REV's, bitwise)
  step "GPU kernel tests and smoke run"
  PY=$PY benchmarks/gpu_kernels_check.sh 2>&1 | grep -E "passed|failed|error|smoke|^===" | tail -8
  ;;
bench)
  ALGOS=${ALGOS:-}
  for net in nvlink sockets; do
    extra=(); [ $net = sockets ] && extra=("${SOCK[@]}")
    for d in 0.01 0.001; do
      range=$LOG2N; [ $d = 0.001 ] && range=${LOG2N_SPARSE:-$LOG2N}
      step "bench $net density $d P=$NP"
      "${MPI[@]}" "${extra[@]}" $PY -m autotune.cli bench --backend nccl --log2n "$range" \
        --density $d --repeat ${REPEAT:-5} --warmup 2 ${ALGOS:+--algorithms $ALGOS} \
        --out "$OUT/bench_${net}_P${NP}_d${d}.json" | grep -v "^  P="
    done
  done
  ;;
profile)
  for net in nvlink sockets; do
    extra=(); [ $net = sockets ] && extra=("${SOCK[@]}")
    step "profile $net P=$NP"
    "${MPI[@]}" "${extra[@]}" $PY -m autotune.cli profile --device gpu --backend nccl \
      ${PROFILE_PLAN:---quick} --quiet --network "$net" --out "$OUT/profile_gpu_${net}_P${NP}.json"
  done
  ;;
train)
  # the digits CNN trained over NCCL, one GPU per rank (examples/digits_cnn.py); `auto`
  # decides from the NVLink profile when the profile stage ran first in this $OUT;
  # TRAIN_EXTRA: more example options (e.g. the warm-up recipe)
  prof="$OUT/profile_gpu_nvlink_P${NP}.json"; penv=()
  [ -f "$prof" ] && penv=(--profile "$prof")
  step "train digits_cnn over NCCL, P=$NP (profile for auto: ${penv[*]:-none})"
  "${MPI[@]}" $PY examples/digits_cnn.py "${penv[@]}" --device cuda --backend nccl \
    --algorithm ${TRAIN_ALGOS:-dense,oktopk,gtopk,topka,auto} --density ${TRAIN_DENSITY:-0.01,0.001} \
    --seed ${TRAIN_SEEDS:-0,1,2} ${TRAIN_EXTRA:-} --quiet --out "$OUT/train_digits_nccl_P${NP}.json"
  $PY examples/plot_curves.py "$OUT/train_digits_nccl_P${NP}.json" --out-dir "$OUT" --tta
  ;;
scaling)
  # CPU ranks only (no GPU used): weak scaling P=2..32 of every MPI algorithm, each network
  # profiled first (autotune profile --quick) so the cost model can be checked on the points.
  # Writes $OUT/scaling_plain.json and, where `ip netns` + `tc` work, $OUT/scaling_slow.json.
  SNP=${SCALING_NP:-2,3,4,6,8,12,16,24,32}
  step "scaling plain (shared memory), CPU ranks P=$SNP, budget ${SCALING_BUDGET:-240} s"
  uptime
  $PY -m benchmarks.scaling measure --network plain --np "$SNP" \
    --log2n ${SCALING_LOG2N:-20,22,24} --repeat ${SCALING_REPEAT:-5} --warmup 2 \
    --budget ${SCALING_BUDGET:-240} --profile-np 4 --mpiexec mpirun \
    --out "$OUT/scaling_plain.json" | grep -v "^  P="
  step "scaling slow (1 Gbit/s namespace, MPI over TCP), CPU ranks P=$SNP"
  uptime
  # exit 3: the namespace cannot be made here (no ip/tc, or not permitted): skipped, said why
  $PY -m benchmarks.scaling measure --network slow --setup-netns autotune_scaling \
    --np "$SNP" --log2n ${SCALING_LOG2N_SLOW:-18,20} --repeat 3 --warmup 1 \
    --budget ${SCALING_BUDGET:-240} --profile-np 2 --mpiexec mpirun \
    --out "$OUT/scaling_slow.json" | grep -v "^  P="
  [ "${PIPESTATUS[0]}" = 3 ] && echo "scaling: slow network SKIPPED (see the reason above)"
  ;;
step)
  # issue #25's GPU figures in one go: per call against raw NCCL and the local work's memory
  # floor, then the training step with the variants interleaved step by step, both networks
  card=h200; nvidia-smi --query-gpu=name --format=csv,noheader | grep -qi h100 && card=h100
  pf="profiles/gpu_${card}_nvlink_p${NP}.json"; popt=(); [ -f "$pf" ] && popt=(--profile "$pf")
  step "per call, P=$NP (auto's profile: ${popt[*]:-none, auto is dense})"
  "${MPI[@]}" $PY -m benchmarks.call_latency --log2n 10,16,20,22,26,27 "${popt[@]}" \
    --algorithms floor,raw,nccl,dense,auto,topka,gtopk,oktopk --rounds ${ROUNDS:-20} \
    --json "$OUT/call_latency_P${NP}.json"
  step "training step, P=$NP"
  $PY -m benchmarks.train_step run -n "$NP" --networks nvlink,sockets --interleave \
    --warmup 8 --steps ${STEPS:-30} --out "$OUT" \
    --variants ${STEP_VARIANTS:-compute,ddp,allreduce,fp16,powersgd1,at:nccl,hook:nccl,at:auto,at:topka,at:gtopk}
  ;;
benchbase)
  # pytest-benchmark baseline of this machine kind (host, mpi and nccl suites at P=$NP),
  # written into the tree and copied to $OUT; compare later with the same --machine/--np
  M=${BENCH_MACHINE:-gpu-h200}
  step "benchmark baseline $M, P=$NP"
  $PY -m tests.benchmarks --machine "$M" --np "$NP" --save -- --color=no
  mkdir -p "$OUT/baselines" && cp -r "tests/benchmarks/baselines/$M" "$OUT/baselines/"
  ;;
esac; done
step "done"
