#!/usr/bin/env bash
# journal.sh compares the journal of this tree with that of another tree
# (BASE, by default a worktree of main) in one run: the in-process
# transport benchmark (BenchmarkKeyedPOST: bare net/http, idem-memory,
# idem-bbolt at 1 and 32 in flight), the journal alone (BenchmarkJournal,
# group commit) and one bbolt commit per Put (BenchmarkBoltPut, this tree
# only), on the disk ($DISKDIR) and on tmpfs ($TMPFSDIR), alternating the
# two builds ROUNDS times so that both see the same machine load.
#
#   git -C .. worktree add ../../wt-main main && BASE=../../wt-main bench/journal.sh
set -euo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-out}
BASE=${BASE:?set BASE to a checkout of the tree to compare with}
ROUNDS=${ROUNDS:-3}
BENCHTIME=${BENCHTIME:-2s}
DISKDIR=${DISKDIR:-/var/tmp}
TMPFSDIR=${TMPFSDIR:-/dev/shm}
mkdir -p "$OUT"
go test -c -o "$OUT/head.test" ..
(cd "$BASE" && go test -c -o "$OLDPWD/$OUT/base.test" .)
{
  echo "# $(date -u +%FT%TZ) $(go version); nproc $(nproc); head $(git -C .. rev-parse --short HEAD); base $(git -C "$BASE" rev-parse --short HEAD)"
  echo "# load before: $(cat /proc/loadavg)"
  for fs in disk tmpfs; do
    dir=$DISKDIR; [ "$fs" = tmpfs ] && dir=$TMPFSDIR
    for round in $(seq "$ROUNDS"); do
      for v in base head; do
        echo "## fs=$fs round=$round build=$v"
        bench='KeyedPOST|Journal/store=group/callers=(1|32)$'
        [ "$v" = head ] && bench="$bench|BoltPut"
        TMPDIR=$dir "$OUT/$v.test" -test.run='^$' -test.bench="$bench" \
          -test.benchtime="$BENCHTIME" -test.benchmem | grep -E '^Benchmark'
      done
    done
  done
  echo "# load after: $(cat /proc/loadavg)"
} | tee "$OUT/journal.txt"
