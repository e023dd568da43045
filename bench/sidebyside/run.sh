#!/bin/bash
# Side by side: the test binaries of BASE (a commit) and of this tree,
# alternating for ROUNDS rounds, then the ratios of issue 25 per round and
# their medians (parse.py). Usage, from anywhere in the repository:
#
#   bash bench/sidebyside/run.sh f7ac623 3
#
# Raw output goes to $OUT (default /tmp/idem-sidebyside). The journal is
# on tmpfs (/dev/shm) for the "tmpfs" rows and in $TMPDIR (or /tmp) for
# the "disk" rows. Run it on a quiet machine: it measures wall time.
set -euo pipefail
base=${1:?usage: run.sh BASE-COMMIT [ROUNDS]}
rounds=${2:-3}
root=$(git rev-parse --show-toplevel)
out=${OUT:-/tmp/idem-sidebyside}
mkdir -p "$out"
rm -f "$out"/*.txt
wt="$out/base-tree"
[ -d "$wt" ] || git -C "$root" worktree add -q --detach "$wt" "$base"
git -C "$wt" checkout -q --detach "$base"
for t in base main; do
  d=$root
  [ $t = base ] && d=$wt
  (cd "$d" && go test -c -o "$out/$t-root.test" . &&
    cd bench && go test -c -o "$out/$t-bench.test" . &&
    cd ../idemserver && go test -c -o "$out/$t-srv.test" .)
done
disk=${TMPDIR:-/tmp}
for r in $(seq "$rounds"); do
  for t in base main; do
    o="$out/$t-$r.txt"
    : >"$o"
    (cd "$root/bench" &&
      TMPDIR=/dev/shm "$out/$t-bench.test" -test.run '^$' -test.bench 'Peers/ok/inflight=(1|32)$/(nethttp|idem-memory|idem-bbolt)$' -test.benchtime 10000x -test.benchmem | grep Bench | sed 's/^/tmpfs /' &&
      TMPDIR=$disk "$out/$t-bench.test" -test.run '^$' -test.bench 'Peers/ok/inflight=32$/(nethttp|idem-memory|idem-bbolt)$' -test.benchtime 5000x -test.benchmem | grep Bench | sed 's/^/disk /' &&
      (cd "$root" && TMPDIR=$disk "$out/$t-root.test" -test.run '^$' -test.bench 'BoltPut' -test.benchtime 2000x | grep Bench | sed 's/^/disk /') &&
      TMPDIR=$disk "$out/$t-bench.test" -test.run '^$' -test.bench 'Peers/ok/inflight=1$/idem-bbolt$' -test.benchtime 2000x -test.benchmem | grep Bench | sed 's/^/disk /' &&
      (cd "$root/idemserver" &&
        TMPDIR=$disk "$out/$t-srv.test" -test.run '^$' -test.bench 'Middleware/store=(bolt|memory)/inflight=32' -test.benchtime 20000x -test.benchmem | grep Bench | sed 's/^/disk /' &&
        TMPDIR=/dev/shm "$out/$t-srv.test" -test.run '^$' -test.bench 'Middleware/store=bolt/inflight=32' -test.benchtime 20000x -test.benchmem | grep Bench | sed 's/^/tmpfs /')) >>"$o"
  done
done
python3 "$root/bench/sidebyside/parse.py" "$out"
