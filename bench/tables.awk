# tables.awk turns BenchmarkPeers / BenchmarkLargeBodies output into
# Markdown tables: awk -f tables.awk out/peers.txt out/large.txt
function metric(name,   i) {
  for (i = 3; i < NF; i++) if ($(i+1) == name) return $i
  return ""
}
/^BenchmarkPeers\// {
  split($1, p, "/"); mode = p[2]; n = p[3]; sub(/inflight=/, "", n); lib = p[4]; sub(/-[0-9]+$/, "", lib)
  rps[mode, n, lib] = metric("req/s"); allocs[mode, n, lib] = metric("allocs/op")
  if (!(mode in seen)) { seen[mode] = 1; modes[++nm] = mode }
  rows[mode] = rows[mode] sprintf("| %s | %s | %.0f | %.0f | %.0f | %s | %s | %.3f | %s |\n", lib, n,
    metric("req/s"), metric("p50-µs"), metric("p99-µs"), metric("allocs/op"), metric("B/op"),
    metric("attempts/op"), metric("non200/op"))
}
/^BenchmarkLargeBodies\// {
  split($1, p, "/"); sub(/-[0-9]+$/, "", p[2])
  large = large sprintf("| %s | %.1f | %.2f | %.0f | %.2f | %.0f |\n", p[2], metric("peak-heap-MiB"),
    metric("peak/bodies"), metric("B/req"), metric("copies/req"), $3 / 1e6)
}
END {
  for (i = 1; i <= nm; i++) {
    print "#### " modes[i]
    print ""
    print "| library | in flight | req/s | p50 µs | p99 µs | allocs/req | B/req | attempts/req | non-200/req |"
    print "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    printf "%s\n", rows[modes[i]]
  }
  print "#### targets (ok, same run)"
  print ""
  m = "ok"
  if (rps[m, 32, "idem-bbolt"] != "") {
    printf "- idem-bbolt / idem-memory req/s at 32 in flight: %.2f (target >= 0.6)\n", rps[m, 32, "idem-bbolt"] / rps[m, 32, "idem-memory"]
    printf "- idem-bbolt / retryablehttp req/s at 32 in flight: %.2f (target >= 0.5)\n", rps[m, 32, "idem-bbolt"] / rps[m, 32, "retryablehttp"]
  } else print "- idem-bbolt: not in this run"
  split("1 32 128", cs, " ")
  for (ci = 1; ci <= 3; ci++) {
    c = cs[ci]
    if (allocs[m, c, "idem-memory"] != "")
      printf "- allocs/req at %d in flight: idem-memory %s, retryablehttp %s (target: idem <= retryablehttp)\n", c, allocs[m, c, "idem-memory"], allocs[m, c, "retryablehttp"]
  }
  for (c = 32; c <= 32; c++) printf "- idem-memory / retryablehttp req/s at 32 in flight: %.2f\n", rps[m, 32, "idem-memory"] / rps[m, 32, "retryablehttp"]
  print ""
  if (large != "") {
    print "| library | peak heap MiB | peak / 64 MiB | B allocated/req | body copies/req | ms/burst |"
    print "|---|---:|---:|---:|---:|---:|"
    printf "%s", large
  }
}
