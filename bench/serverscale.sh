#!/usr/bin/env bash
# serverscale.sh builds BoltStore files of N keys (default 1000000 and
# 5000000) with bench/cmd/serverscale, then measures each from a copy, in
# a fresh process, twice warm and once cold (the page cache dropped: run as
# root). Files go to $DIR (default /tmp), about 480 bytes per key.
#
#   bench/serverscale.sh                # 1M and 5M keys
#   bench/serverscale.sh 1000000        # 1M only
set -euo pipefail
cd "$(dirname "$0")"
DIR=${DIR:-/tmp}
go build -o "$DIR/serverscale" ./cmd/serverscale
for n in "${@:-1000000 5000000}"; do
  for k in $n; do
    orig="$DIR/serverscale-$k.orig.db" db="$DIR/serverscale-$k.db"
    rm -f "$orig" "$db"
    "$DIR/serverscale" -path "$orig" -keys "$k" build
    for mode in warm warm cold; do
      cp "$orig" "$db"; sync
      flag=""; [ "$mode" = cold ] && flag=-cold
      echo "# $k keys, $mode"
      "$DIR/serverscale" -path "$db" -keys "$k" $flag measure
    done
    rm -f "$orig" "$db"
  done
done
