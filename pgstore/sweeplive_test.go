package pgstore_test

import (
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

var (
	sweepLive     = flag.Bool("sweep.live", false, "run TestSweepUnderTraffic: live p99 with and without a Sweep")
	sweepLiveRows = flag.Int("sweep.rows", 100000, "TestSweepUnderTraffic's finished rows to sweep")
)

// TestSweepUnderTraffic measures what a Sweep costs live traffic: durable
// keyed POSTs through idem on pgstore (8 in flight, a loopback server
// answering 201) for 3 s without a sweep, then while Sweep deletes
// -sweep.rows finished rows of 1 KB, then 3 s more without (the two quiet
// windows are one sample, so a drift of the machine's load weighs on both
// sides); it reports each phase's p50 and p99
// and the sweep's duration. Measured, not asserted (timings on a shared
// machine); behind a flag for its length (the test binary's flags go
// after -args: without it, go test takes ./pgstore for one of them and
// runs the root package):
//
//	go test -count=1 ./pgstore -run TestSweepUnderTraffic -v -args -sweep.live -sweep.rows 100000
func TestSweepUnderTraffic(t *testing.T) {
	if !*sweepLive {
		t.Skip("a long measurement: run with -sweep.live")
	}
	ctx := testContext(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	s := openStore(t)
	cutoff := time.Now()
	oldRows(t, s, *sweepLiveRows, cutoff)
	_, err := s.Pool().Exec(ctx, `VACUUM ANALYZE `+quotedOps(s))
	require.NoError(t, err)
	base := newBase()
	defer base.CloseIdleConnections()
	c := idem.New(s, idem.WithBaseTransport(base))
	defer c.Close()

	live := func(stop <-chan struct{}) []time.Duration {
		var mu sync.Mutex
		var lat []time.Duration
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{"amount":4200}`))
					start := time.Now()
					resp, err := c.HTTPClient().Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					d := time.Since(start)
					mu.Lock()
					lat = append(lat, d)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		slices.Sort(lat)
		return lat
	}
	pct := func(lat []time.Duration, p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[int(float64(len(lat)-1)*p)]
	}

	window := func() []time.Duration {
		stop := make(chan struct{})
		time.AfterFunc(3*time.Second, func() { close(stop) })
		return live(stop)
	}
	quiet := window()

	stop := make(chan struct{})
	var swept int
	var sweepErr error
	var took time.Duration
	go func() {
		start := time.Now()
		swept, sweepErr = s.Sweep(ctx, cutoff)
		took = time.Since(start)
		close(stop)
	}()
	during := live(stop)
	quiet = append(quiet, window()...)
	slices.Sort(quiet)
	require.NoError(t, sweepErr)
	require.Equal(t, *sweepLiveRows, swept)
	t.Logf("without sweep: %d calls, p50 %v, p99 %v", len(quiet), pct(quiet, .5), pct(quiet, .99))
	t.Logf("during sweep:  %d calls, p50 %v, p99 %v; sweep of %d rows took %v", len(during), pct(during, .5), pct(during, .99), swept, took)
	t.Logf("p99 during ÷ without: %.2f", float64(pct(during, .99))/float64(pct(quiet, .99)))
}

func quotedOps(s interface{ Schema() string }) string {
	return `"` + s.Schema() + `".operations`
}
