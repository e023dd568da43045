package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemgo/idem"
)

func init() {
	libs = append(libs, lib{name: "idem-bbolt", newClient: newIdemBolt})
}

func newIdemBolt(tb testing.TB, base http.RoundTripper, dir string, maxBody int64) client {
	c, err := idem.Open(filepath.Join(dir, "idem.db"), idemOptions(base, maxBody)...)
	if err != nil {
		tb.Fatal(err)
	}
	return client{do: c.HTTPClient().Do, close: func() { c.Close() }}
}

// TestFsyncLoad opens a journal, sends IDEMBENCH_FSYNC_N keyed POSTs with
// IDEMBENCH_FSYNC_INFLIGHT in flight, and closes the journal. run.sh runs
// it under strace -c to count fsync and fdatasync calls; the run with
// N=0 gives the fixed cost of Open and Close.
func TestFsyncLoad(t *testing.T) {
	nStr := os.Getenv("IDEMBENCH_FSYNC_N")
	if nStr == "" {
		t.Skip("set IDEMBENCH_FSYNC_N and IDEMBENCH_FSYNC_INFLIGHT (run.sh does)")
	}
	n, err := strconv.Atoi(nStr)
	if err != nil {
		t.Fatal(err)
	}
	inflight, err := strconv.Atoi(os.Getenv("IDEMBENCH_FSYNC_INFLIGHT"))
	if err != nil || inflight < 1 {
		t.Fatal("IDEMBENCH_FSYNC_INFLIGHT must be a positive number")
	}
	base := newBase()
	defer base.CloseIdleConnections()
	c := newIdemBolt(t, base, t.TempDir(), 0)
	url := serverURL + pathOK
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	for range inflight {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, url, bytes.NewReader(smallBody))
				resp, err := c.do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	c.close()
	if f := failed.Load(); f > 0 {
		t.Fatalf("%d of %d requests failed", f, n)
	}
	fmt.Printf("fsyncload: n=%d inflight=%d\n", n, inflight)
}
