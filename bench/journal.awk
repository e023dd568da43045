# journal.awk summarises out/journal.txt (bench/journal.sh): the median
# over rounds of each benchmark's rate (req/s or ops/s) and allocs/op, per
# file system and build.
#
#   awk -f journal.awk out/journal.txt
/^## / {
  split($2, a, "="); fs = a[2]; split($4, b, "="); build = b[2]; next
}
/^Benchmark/ {
  name = $1; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
  rate = ""; allocs = ""
  for (i = 2; i <= NF; i++) {
    if ($i == "req/s" || $i == "ops/s") rate = $(i-1)
    if ($i == "allocs/op") allocs = $(i-1)
  }
  k = fs SUBSEP build SUBSEP name
  if (!(k in n)) order[++m] = k
  n[k]++; r[k, n[k]] = rate; al[k, n[k]] = allocs
}
function median(arr, k, cnt,   i, j, t, v) {
  for (i = 1; i <= cnt; i++) v[i] = arr[k, i] + 0
  for (i = 1; i <= cnt; i++) for (j = i + 1; j <= cnt; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
  return cnt % 2 ? v[(cnt + 1) / 2] : (v[cnt / 2] + v[cnt / 2 + 1]) / 2
}
END {
  print "| fs | build | benchmark | rate (median) | allocs/op | runs |"
  print "|---|---|---|---:|---:|---:|"
  for (x = 1; x <= m; x++) {
    k = order[x]; split(k, p, SUBSEP)
    printf "| %s | %s | %s | %.0f | %.0f | %d |\n", p[1], p[2], p[3], median(r, k, n[k]), median(al, k, n[k]), n[k]
  }
}
