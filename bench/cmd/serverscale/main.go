// Command serverscale measures idemserver's BoltStore at millions of
// stored keys: how long Open takes and how much memory the process holds
// after it, the latency of a replay and of a new key, and a sweep's cost
// with the latency of new keys while it runs.
//
//	serverscale -path /tmp/keys.db -keys 1000000 build   # write the store once
//	serverscale -path /tmp/keys.db -keys 1000000 measure # in a fresh process
//	serverscale -path /tmp/keys.db -keys 1000000 -cold measure
//
// build completes -keys keys through the Store API (1024 callers, so
// group commits of up to 1024), each with a 201 answer of about 250 bytes
// (a JSON body and a Content-Type), expiring evenly over a 24-hour
// retention. measure, meant for a process of its own, opens the store
// (after dropping the page cache with -cold: it must run as root), prints
// Open's time and the process's RSS and Go heap, then times 20,000 replays
// of stored keys and 20,000 new keys, then a sweep that deletes a tenth of
// the keys while one caller keeps completing new keys.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem/idemserver"
)

var t0 = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

const retention = 24 * time.Hour

func main() {
	path := flag.String("path", "", "the store file")
	keys := flag.Int("keys", 1_000_000, "stored keys")
	cold := flag.Bool("cold", false, "drop the page cache before Open (root only)")
	reopen := flag.Int("reopen", 0, "measure: open and close the store this many times first, timing each")
	flag.Parse()
	if *path == "" || flag.NArg() != 1 {
		log.Fatal("usage: serverscale -path FILE [-keys N] [-cold] build|measure")
	}
	switch flag.Arg(0) {
	case "build":
		build(*path, *keys)
	case "measure":
		for i := range *reopen {
			start := time.Now()
			s, err := idemserver.OpenBoltStore(*path, nil)
			if err != nil {
				log.Fatal(err)
			}
			open := time.Since(start)
			if err := s.Close(); err != nil {
				log.Fatal(err)
			}
			fmt.Printf("reopen %d: %v\n", i+1, open.Round(time.Millisecond))
		}
		measure(*path, *keys, *cold)
	default:
		log.Fatalf("unknown command %q", flag.Arg(0))
	}
}

// id returns the store id of the i-th key, a hex SHA-256 as the
// middleware's.
func id(i int) string {
	sum := sha256.Sum256([]byte("key-" + strconv.Itoa(i)))
	return hex.EncodeToString(sum[:])
}

// at returns the time the i-th of n keys was completed: evenly over the
// retention before t0+retention.
func at(i, n int) time.Time { return t0.Add(time.Duration(int64(retention) / int64(n) * int64(i))) }

func answer(i int) *idemserver.Response {
	body := fmt.Sprintf(`{"id":"ord_%012d","status":"created","amount":4200,"currency":"EUR","customer":"cus_%012d","items":[{"sku":"sku-1","qty":1},{"sku":"sku-2","qty":3}],"created_at":"2026-12-01T00:00:00Z"}`, i, i)
	return &idemserver.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(body)}
}

func complete(ctx context.Context, s idemserver.Store, i int, now time.Time) error {
	c, err := s.Begin(ctx, idemserver.Begin{ID: id(i), Fingerprint: id(-i - 1), Now: now, LeaseUntil: now.Add(time.Minute)})
	if err != nil {
		return err
	}
	if c.State != idemserver.StateAcquired {
		return fmt.Errorf("key %d: %v", i, c.State)
	}
	return s.Complete(ctx, idemserver.Completion{ID: id(i), Token: c.Token, Response: answer(i), Now: now, Until: now.Add(retention)})
}

func build(path string, n int) {
	s, err := idemserver.OpenBoltStore(path, nil)
	if err != nil {
		log.Fatal(err)
	}
	start := time.Now()
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 1024 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := complete(ctx, s, i, at(i, n)); err != nil {
					log.Fatal(err)
				}
			}
		})
	}
	wg.Wait()
	if err := s.Close(); err != nil {
		log.Fatal(err)
	}
	st, _ := os.Stat(path)
	fmt.Printf("build: %d keys in %v, file %.0f MiB\n", n, time.Since(start).Round(time.Millisecond), float64(st.Size())/(1<<20))
}

// status returns the field of /proc/self/status, such as "VmRSS".
func status(field string) string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "?"
	}
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return "?"
}

func quantiles(d []time.Duration) string {
	slices.Sort(d)
	q := func(p float64) time.Duration { return d[int(p*float64(len(d)-1))] }
	return fmt.Sprintf("p50 %v, p99 %v, max %v", q(0.5), q(0.99), d[len(d)-1])
}

func measure(path string, n int, cold bool) {
	if cold {
		if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
			log.Fatalf("drop the page cache: %v", err)
		}
	}
	var ms runtime.MemStats
	start := time.Now()
	s, err := idemserver.OpenBoltStore(path, nil)
	if err != nil {
		log.Fatal(err)
	}
	open := time.Since(start)
	runtime.GC()
	runtime.ReadMemStats(&ms)
	fmt.Printf("open (%s): %v; VmRSS %s (RssAnon %s, RssFile %s), VmHWM %s, Go heap %.1f MiB (%.1f bytes per key)\n",
		map[bool]string{true: "cold", false: "warm"}[cold], open.Round(time.Millisecond), status("VmRSS"), status("RssAnon"), status("RssFile"), status("VmHWM"),
		float64(ms.HeapAlloc)/(1<<20), float64(ms.HeapAlloc)/float64(n))

	ctx := context.Background()
	now := t0.Add(retention) // every key live
	const samples = 20000
	lat := make([]time.Duration, 0, samples)
	for range samples {
		i := rand.IntN(n)
		t := time.Now()
		c, err := s.Begin(ctx, idemserver.Begin{ID: id(i), Fingerprint: id(-i - 1), Now: now, LeaseUntil: now.Add(time.Minute)})
		lat = append(lat, time.Since(t))
		if err != nil || c.State != idemserver.StateDone {
			log.Fatalf("replay of key %d: %v %v", i, c.State, err)
		}
	}
	fmt.Printf("replay (Begin of a stored key, random): %s\n", quantiles(lat))

	lat = lat[:0]
	for j := range samples {
		t := time.Now()
		if err := complete(ctx, s, n+j, now); err != nil {
			log.Fatal(err)
		}
		lat = append(lat, time.Since(t))
	}
	fmt.Printf("new key (Begin and Complete, one caller, one commit each): %s\n", quantiles(lat))

	// A sweep that takes a tenth of the keys, with one caller completing
	// new keys meanwhile.
	sweepAt := t0.Add(retention + retention/10)
	var done atomic.Bool
	var during []time.Duration
	var wg sync.WaitGroup
	wg.Go(func() {
		for j := samples; !done.Load(); j++ {
			t := time.Now()
			if err := complete(ctx, s, n+j, sweepAt); err != nil {
				log.Fatal(err)
			}
			during = append(during, time.Since(t))
		}
	})
	start = time.Now()
	swept, err := s.Sweep(ctx, sweepAt)
	sweep := time.Since(start)
	done.Store(true)
	wg.Wait()
	if err != nil {
		log.Fatal(err)
	}
	_ = ms
	fmt.Printf("sweep: %d keys in %v (%.1f µs per key); new keys meanwhile: %d, %s\n",
		swept, sweep.Round(time.Millisecond), float64(sweep.Microseconds())/float64(max(swept, 1)), len(during), quantiles(during))
	runtime.ReadMemStats(&ms)
	fmt.Printf("after: VmRSS %s (RssAnon %s, RssFile %s), VmHWM %s\n", status("VmRSS"), status("RssAnon"), status("RssFile"), status("VmHWM"))
	if err := s.Close(); err != nil {
		log.Fatal(err)
	}
}
