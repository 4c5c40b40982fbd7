#!/usr/bin/env bash
# One off-profile data set for docs/BENCHMARKS.md "Selector regret" (issue #23): `--quick`
# profiles at P = 2 and 4, in shared memory and in a 1 Gbit/s namespace, then two interleaved
# sweeps per network at P = 3, 6, 8 at sizes no profile ran (1 Gbit/s: calls on an idle link).
#
#   NAME=u01 SIZES=2600,41017,410009,3050003 SHM_EXTRA=7100003 OUT=DIR benchmarks/offprofile_set.sh
#   python -m benchmarks.regret --profile DIR/u01_prof4_slow_p4.json --measured DIR/u01[ab]_slowgap_p*.json
#
# Writes DIR/NAME_prof{2,4}_{shm,slow}_p{2,4}.json and DIR/NAME{a,b}_{shm,slowgap}_p{3,6,8}.json
# (docs/data/offprofile keeps its files as `gzip -n`'s .json.gz: every reader takes either).
# Needs root (`ip netns`, `tc`); run it on a quiet host, from the repository root, with the
# venv at .venv (AUTOTUNE / PYTHON to use others). The namespace and the ranks' MPI settings
# are benchmarks/scaling.py's (`setup_netns`, `SLOW_MPI_ENV`), as for the scaling study.
set -euo pipefail
: "${NAME:?set NAME}" "${SIZES:?set SIZES}" "${OUT:?set OUT}"
SHM_EXTRA=${SHM_EXTRA:-}
AUTOTUNE=${AUTOTUNE:-$PWD/.venv/bin/autotune}
PYTHON=${PYTHON:-$PWD/.venv/bin/python}
NS=${NS:-offprofile_$$}
mkdir -p "$OUT"

netns() { "$PYTHON" -c "import sys, benchmarks.scaling as s; s.${1}_netns(sys.argv[1])" "$NS"; }
netns setup
trap 'netns teardown' EXIT
read -r -a MPI_ENV < <("$PYTHON" -c \
  "from benchmarks.scaling import SLOW_MPI_ENV as e; print(*(f'{k}={v}' for k, v in e.items()))")
slow() { ip netns exec "$NS" env "${MPI_ENV[@]}" "$@"; }

for P in 2 4; do
  "$AUTOTUNE" launch -n $P -m autotune.cli profile --quick --network shm \
    --out "$OUT/${NAME}_prof${P}_shm_p${P}.json"
  slow "$AUTOTUNE" launch -n $P -m autotune.cli profile --quick --network tcp-1gbit \
    --out "$OUT/${NAME}_prof${P}_slow_p${P}.json"
done
for sweep in a b; do
  for P in 3 6 8; do
    "$AUTOTUNE" launch -n $P -m autotune.cli bench --sizes "$SIZES${SHM_EXTRA:+,$SHM_EXTRA}" \
      --repeat 5 --warmup 2 --order interleaved --out "$OUT/${NAME}${sweep}_shm_p${P}.json" \
      > /dev/null
    slow "$AUTOTUNE" launch -n $P -m autotune.cli bench --sizes "$SIZES" --repeat 5 --warmup 2 \
      --order interleaved --gap-ms 12 --out "$OUT/${NAME}${sweep}_slowgap_p${P}.json" > /dev/null
  done
done
echo "wrote $OUT/${NAME}*"
