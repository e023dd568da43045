package boltjournal_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemgo/idem/boltjournal"
	"github.com/idemgo/idem/idemstore"
)

// TestBoltStoreSteadyStateSize sends IDEM_STEADY_N keyed operations
// (Reserve, then Finish) through a journal at a simulated 50 per second,
// sweeping once a simulated hour with one hour of retention, as the
// Transport does with WithRetention(time.Hour), and checks that the file
// stops growing once the retention window is full. (A million operations
// at that rate are five and a half simulated hours.) It is off by default
// (a million operations take a minute or more); run it with
//
//	IDEM_STEADY_N=1000000 go test -run SteadyStateSize -v .
func TestBoltStoreSteadyStateSize(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("IDEM_STEADY_N"))
	if n == 0 {
		t.Skip("set IDEM_STEADY_N (for example 1000000) to run")
	}
	const (
		perSecond = 50
		retention = time.Hour
		callers   = 32
	)
	path := filepath.Join(t.TempDir(), "journal.db")
	s, err := boltjournal.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	start := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	var seq atomic.Int64
	now := func() time.Time { return start.Add(time.Duration(seq.Load()) * time.Second / perSecond) }
	ctx := t.Context()
	body := []byte(`{"amount":4200,"currency":"eur","customer":"cus_123","description":"order 42"}`)
	size := func() int64 {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	perHour := int64(perSecond * 3600)
	var (
		mu    sync.Mutex
		sizes []int64 // file size at the end of each simulated hour, before its sweep
	)
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for {
				i := seq.Add(1)
				if i > int64(n) {
					return
				}
				at := now()
				op := idemstore.Operation{
					State: idemstore.StatePending, Created: at, Updated: at,
					Key: uuid.Must(uuid.NewV7()).String(), Method: http.MethodPost,
					URL: "https://api.example.com/v1/charges", Fingerprint: [32]byte{1, 2, 3},
					Owner: "idem-host-1-4242", Header: http.Header{"Content-Type": {"application/json"}}, Body: body,
				}
				if _, _, err := s.Reserve(ctx, op); err != nil {
					t.Error(err)
					return
				}
				if err := s.Finish(ctx, op.Key, idemstore.Outcome{State: idemstore.StateSucceeded, Status: 201, Sent: 1, At: at}); err != nil {
					t.Error(err)
					return
				}
				if i%perHour == 0 {
					mu.Lock()
					sizes = append(sizes, size())
					mu.Unlock()
					swept, err := s.Sweep(ctx, now().Add(-retention))
					if err != nil {
						t.Error(err)
						return
					}
					t.Logf("hour %d: file %.1f MiB before the sweep; swept %d", i/perHour, float64(sizes[len(sizes)-1])/(1<<20), swept)
				}
			}
		})
	}
	wg.Wait()
	if _, err := s.Get(ctx, "nothing"); err == nil { // settles the last marks
		t.Fatal("found a key never reserved")
	}
	final := size()
	fmt.Printf("steady: n=%d final_bytes=%d hourly_bytes=%v\n", n, final, sizes)
	if len(sizes) < 4 {
		t.Skipf("only %d simulated hours: too few to see a steady state (need IDEM_STEADY_N >= %d)", len(sizes), 4*perHour)
	}
	// Just before the sweep of hour 2 the file holds its peak: two hours
	// of records.
	t.Logf("%d operations: file %.1f MiB at the end; %.0f bytes of file per record at the peak of %d records",
		n, float64(final)/(1<<20), float64(sizes[1])/float64(2*perHour), 2*perHour)
	// From the second hour on the window is full and freed pages are
	// reused; bbolt grows its file in steps of 16 MiB, and may take one
	// more step while its free pages are fragmented. After that the file
	// must not grow: not in the last simulated hour, nor beyond one step.
	if last := sizes[len(sizes)-1]; final > last || sizes[len(sizes)-2] != last {
		t.Fatalf("the file still grows: %d, %d bytes at the last two hours, %d at the end", sizes[len(sizes)-2], last, final)
	}
	if final > sizes[1]+17<<20 { // one step, and bbolt's rounding
		t.Fatalf("the file grew from %d bytes at hour 2 to %d, more than one allocation step", sizes[1], final)
	}
}
