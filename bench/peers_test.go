// Package bench compares idem with the HTTP retry libraries a Go programmer
// would otherwise pick, over loopback, against a server in a child process.
// It is its own module so that the peers never enter idem's go.mod.
//
// Run it with run.sh; bench/HISTORY.md ("Peers") explains the figures.
package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/google/uuid"
	"github.com/hashicorp/go-retryablehttp"

	"github.com/idemgo/idem"
)

// Retry settings shared by every library that retries: 4 attempts in all,
// backoff from 1 ms capped at 10 ms (short, so that the 503 runs measure
// the libraries and not the sleeps).
const (
	maxAttempts = 4
	backoffMin  = time.Millisecond
	backoffMax  = 10 * time.Millisecond
)

// smallBody is the keyed POST's JSON payload.
var smallBody = []byte(`{"amount":1999,"currency":"eur","customer":"cus_9s6XKzkNRiz8i3","description":"order 42"}`)

// inflights are the numbers of requests in flight the benchmarks compare.
var inflights = []int{1, 32, 128}

// client is one library set up to send keyed POSTs.
type client struct {
	// do sends req (a POST; the library adds or keeps the key) and returns
	// the response, whose body the caller reads and closes.
	do    func(req *http.Request) (*http.Response, error)
	close func()
}

// lib is a library under comparison.
type lib struct {
	name string
	// keyByHand reports whether the caller must put the key on the request.
	keyByHand bool
	// newClient returns a client whose attempts go through base. dir is an
	// empty directory for a journal; maxBody is the largest body sent.
	newClient func(tb testing.TB, base http.RoundTripper, dir string, maxBody int64) client
}

// libs lists the libraries in the order of the tables; bolt_test.go adds
// idem with the bbolt journal.
var libs = []lib{
	{name: "nethttp", keyByHand: true, newClient: newNetHTTP},
	{name: "retryablehttp", keyByHand: true, newClient: newRetryableHTTP},
	{name: "failsafehttp", keyByHand: true, newClient: newFailsafeHTTP},
	{name: "idem-memory", newClient: newIdemMemory},
}

// newBase returns the transport every library sends its attempts through:
// the same settings for all, with enough idle connections for 128 in
// flight so that no library pays for new connections.
func newBase() *http.Transport {
	return &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        512,
		MaxIdleConnsPerHost: 512,
		IdleConnTimeout:     90 * time.Second,
	}
}

func newNetHTTP(_ testing.TB, base http.RoundTripper, _ string, _ int64) client {
	hc := &http.Client{Transport: base}
	return client{do: hc.Do, close: func() {}}
}

func newRetryableHTTP(_ testing.TB, base http.RoundTripper, _ string, _ int64) client {
	rc := retryablehttp.NewClient()
	rc.HTTPClient = &http.Client{Transport: base}
	rc.Logger = nil
	rc.RetryMax = maxAttempts - 1
	rc.RetryWaitMin, rc.RetryWaitMax = backoffMin, backoffMax
	// Give the last response back, as idem and failsafehttp do, instead of
	// an error.
	rc.ErrorHandler = retryablehttp.PassthroughErrorHandler
	return client{
		do: func(req *http.Request) (*http.Response, error) {
			rreq, err := retryablehttp.FromRequest(req)
			if err != nil {
				return nil, err
			}
			return rc.Do(rreq)
		},
		close: func() {},
	}
}

func newFailsafeHTTP(_ testing.TB, base http.RoundTripper, _ string, _ int64) client {
	policy := failsafehttp.NewRetryPolicyBuilder().
		WithMaxAttempts(maxAttempts).
		WithBackoff(backoffMin, backoffMax).
		ReturnLastFailure().
		// failsafehttp does not close the responses it retries; without
		// this each retried 503 would hold its connection forever.
		OnRetryScheduled(func(e failsafe.ExecutionScheduledEvent[*http.Response]) {
			if r := e.LastResult(); r != nil {
				io.Copy(io.Discard, r.Body)
				r.Body.Close()
			}
		}).
		Build()
	hc := &http.Client{Transport: failsafehttp.NewRoundTripper(base, policy)}
	return client{do: hc.Do, close: func() {}}
}

// idemOptions are the options every idem variant gets.
func idemOptions(base http.RoundTripper, maxBody int64) []idem.Option {
	return []idem.Option{
		idem.WithBaseTransport(base),
		idem.WithMaxAttempts(maxAttempts),
		idem.WithBackoff(backoffMin, backoffMax),
		idem.WithMaxBodyBytes(max(maxBody, idem.DefaultMaxBodySize)),
	}
}

func newIdemMemory(_ testing.TB, base http.RoundTripper, _ string, maxBody int64) client {
	c := idem.New(idem.NewMemoryStore(), idemOptions(base, maxBody)...)
	return client{do: c.HTTPClient().Do, close: func() { c.Close() }}
}

// countingTransport counts attempts.
type countingTransport struct {
	base http.RoundTripper
	n    atomic.Int64
}

func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.n.Add(1)
	return t.base.RoundTrip(req)
}

// newKey returns a key for the libraries that need one by hand: a random
// UUIDv7, the kind idem makes.
func newKey() string {
	u, err := uuid.NewV7()
	if err != nil {
		panic(err)
	}
	return u.String()
}

// BenchmarkPeers sends keyed POSTs with a small JSON body at 1, 32 and 128
// in flight (a fixed pool of that many goroutines sharing b.N requests),
// to a server that always answers 200 (ok) or answers 503 to every 10th
// attempt (fail10). One op is one logical request, retries included.
func BenchmarkPeers(b *testing.B) {
	for _, mode := range []struct{ name, path string }{{"ok", pathOK}, {"fail10", pathFlaky}} {
		b.Run(mode.name, func(b *testing.B) {
			// The libraries compared at one in-flight count run back to
			// back, so that they see the same background load.
			for _, n := range inflights {
				b.Run(fmt.Sprintf("inflight=%d", n), func(b *testing.B) {
					for _, l := range libs {
						b.Run(l.name, func(b *testing.B) {
							benchSmall(b, l, n, serverURL+mode.path)
						})
					}
				})
			}
		})
	}
}

func benchSmall(b *testing.B, l lib, inflight int, url string) {
	base := newBase()
	defer base.CloseIdleConnections()
	counter := &countingTransport{base: base}
	c := l.newClient(b, counter, b.TempDir(), int64(len(smallBody)))
	defer c.close()

	send := func() (int, error) {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, bytes.NewReader(smallBody))
		if err != nil {
			return 0, err
		}
		req.Header.Set("Content-Type", "application/json")
		if l.keyByHand {
			req.Header.Set("Idempotency-Key", newKey())
		}
		resp, err := c.do(req)
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	// Warm the connection pool so that no run pays for dialing.
	warm(inflight, send)
	counter.n.Store(0)

	lats := make([][]time.Duration, inflight)
	for i := range lats {
		lats[i] = make([]time.Duration, 0, b.N/inflight+1)
	}
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	start := time.Now()
	for w := range inflight {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				t0 := time.Now()
				status, err := send()
				lats[w] = append(lats[w], time.Since(t0))
				if err != nil || status != http.StatusOK {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	b.StopTimer()

	all := slices.Concat(lats...)
	slices.Sort(all)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
	b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(counter.n.Load())/float64(b.N), "attempts/op")
	b.ReportMetric(float64(failed.Load())/float64(b.N), "non200/op")
}

// cpuTime returns the CPU time (user and system) this process has used:
// the client's cost of a request, which the server in its child process
// does not share. It includes the runtime's idle spinning, which at one
// request in flight is most of it: compare it between libraries at the
// same in-flight count, not as an absolute cost.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// warm sends a few rounds of inflight concurrent requests.
func warm(inflight int, send func() (int, error)) {
	var wg sync.WaitGroup
	for range inflight {
		wg.Go(func() {
			for range 3 {
				send()
			}
		})
	}
	wg.Wait()
}
