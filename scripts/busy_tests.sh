#!/usr/bin/env bash
# `make test` on a fresh clone with an empty kernel cache, RUNS times in a row, while a CPU hog loads every core:
# the fast suite must not depend on having the machine to itself (issue 48; docs/testing.md).
#
#   scripts/busy_tests.sh [RUNS]        (default 10; stress-ng from Debian, else a busy loop per core)
#
# The clone and its cache live in a temporary folder; its log is kept beside them and its path printed. The hog is
# stopped by its process id when the script ends, however it ends.
set -euo pipefail
RUNS=${1:-10}
SRC=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/specdec-busy-tests.XXXXXX)
LOG=$WORK/runs.log
git clone -q "$SRC" "$WORK/clone"
export SPECDEC_CACHE=$WORK/cache
mkdir -p "$SPECDEC_CACHE"
cores=$(nproc)
if command -v stress-ng >/dev/null; then
  stress-ng --cpu "$cores" --quiet &
  HOG="stress-ng --cpu $cores"
else
  python3 -c 'import multiprocessing as m
def spin():
    while True: pass
ps = [m.Process(target=spin) for _ in range(m.cpu_count())]
[p.start() for p in ps]; [p.join() for p in ps]' &
  HOG="a Python busy loop per core"
fi
hog=$!
cleanup() { pkill -P "$hog" 2>/dev/null; kill "$hog" 2>/dev/null || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM
echo "busy-tests: $(git -C "$WORK/clone" rev-parse --short HEAD), $RUNS runs of make test beside $HOG (pid $hog); log $LOG"
cd "$WORK/clone"
make setup > "$WORK/setup.log" 2>&1 || { echo "busy-tests: make setup failed: $WORK/setup.log"; exit 1; }
failed=0
for i in $(seq 1 "$RUNS"); do
  t0=$SECONDS
  if make test > "$WORK/run-$i.log" 2>&1; then status=passed; else status=FAILED; failed=$((failed + 1)); fi
  line=$(grep -E '[0-9]+ (passed|failed)' "$WORK/run-$i.log" | tail -1)
  echo "busy-tests: run $i $status in $((SECONDS - t0)) s: $line" | tee -a "$LOG"
done
echo "busy-tests: $((RUNS - failed)) of $RUNS runs green" | tee -a "$LOG"
[ "$failed" = 0 ]
