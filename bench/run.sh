#!/usr/bin/env bash
# run.sh runs every peer benchmark once, in one go, and writes raw output to
# bench/out/ (or $OUT): peers.txt (small keyed POSTs, ok and 10% 503),
# large.txt (64 x 1 MiB bodies), fsync.txt (fsyncs per request of idem's
# bbolt journal, counted with strace) and peers.png (req/s vs in flight).
#
#   bench/run.sh                 # full run, about 3 minutes
#   BENCHTIME=1000x bench/run.sh # shorter, for a smoke test
set -euo pipefail
cd "$(dirname "$0")"

OUT=${OUT:-out}
BENCHTIME=${BENCHTIME:-3s}
LARGETIME=${LARGETIME:-10x}
FSYNC_N=${FSYNC_N:-3000}
mkdir -p "$OUT"


{
  echo "# $(date -u +%FT%TZ) $(go version)"
  echo "# nproc $(nproc); $(uname -srm)"
  echo "# disk of \$TMPDIR: $(df -P "${TMPDIR:-/tmp}" | awk 'NR==2 {print $1}') rotational=$(cat /sys/block/"$(basename "$(df -P "${TMPDIR:-/tmp}" | awk 'NR==2 {print $1}')")"/queue/rotational 2>/dev/null || echo '?')"
  echo "# idem at $(git -C .. rev-parse --short HEAD)$(git -C .. status --porcelain -- ':!bench' ':!BENCHMARKS.md' | grep -q . && echo ' + uncommitted changes')"
  if [ -f ../boltjournal/boltstore.go ]; then echo "# boltjournal/boltstore.go sha256 $(sha256sum ../boltjournal/boltstore.go | cut -c1-16) ($(git -C .. ls-files --error-unmatch boltjournal/boltstore.go > /dev/null 2>&1 && echo committed || echo uncommitted))"; fi
  echo "# load before: $(cat /proc/loadavg)"
} | tee "$OUT/machine.txt"

go test -c -o "$OUT/bench.test" .

"$OUT/bench.test" -test.run='^$' -test.bench='^BenchmarkPeers$' \
  -test.benchtime="$BENCHTIME" -test.benchmem | tee "$OUT/peers.txt"
"$OUT/bench.test" -test.run='^$' -test.bench='^BenchmarkLargeBodies$' \
  -test.benchtime="$LARGETIME" | tee "$OUT/large.txt"

# fsyncs per request: strace counts fsync/fdatasync of the whole process
# tree (the server child never syncs); the N=0 run is the fixed cost of
# opening and closing the journal, subtracted from each N=FSYNC_N run.
: > "$OUT/fsync.txt"
if command -v strace > /dev/null; then
  count() { # count N INFLIGHT -> number of fsync+fdatasync calls
    IDEMBENCH_FSYNC_N=$1 IDEMBENCH_FSYNC_INFLIGHT=$2 \
      strace -f -c -e trace=fsync,fdatasync -o "$OUT/strace.tmp" \
      "$OUT/bench.test" -test.run='^TestFsyncLoad$' > /dev/null
    awk '$NF=="fsync" || $NF=="fdatasync" {n += $4} END {print n+0}' "$OUT/strace.tmp"
  }
  echo "inflight requests fsyncs fixed fsyncs_per_request ideal_commits_per_request" | tee -a "$OUT/fsync.txt"
  for c in 1 32 128; do
    fixed=$(count 0 "$c")
    total=$(count "$FSYNC_N" "$c")
    # Ideal: one commit per group of c requests (a bbolt commit issues two
    # fdatasyncs: data pages, then the meta page); awk prints the measured
    # per-request count (fixed cost removed).
    echo "$c $FSYNC_N $total $fixed" |
      awk '{printf "%d %d %d %d %.3f %.3f\n", $1, $2, $3, $4, ($3-$4)/$2, 1/$1}' | tee -a "$OUT/fsync.txt"
  done
  rm -f "$OUT/strace.tmp"
  echo "# ideal_per_request counts commits (1 per group of in-flight requests); one bbolt commit issues fdatasync more than once, see bench/HISTORY.md (Durability cost)" >> "$OUT/fsync.txt"
else
  echo "# skipped: strace missing (apt-get install -y strace)" | tee -a "$OUT/fsync.txt"
fi

echo "# load after: $(cat /proc/loadavg)" | tee -a "$OUT/machine.txt"
go run ./cmd/plot -o "$OUT/peers.png" < "$OUT/peers.txt"
awk -f tables.awk "$OUT/peers.txt" "$OUT/large.txt" > "$OUT/tables.md"
echo "wrote $OUT/"
