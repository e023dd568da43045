// Package storetest is the conformance suite for implementations of
// idemserver.Store, in the manner of testing/fstest: a store proves itself
// by passing Run.
//
//	func TestMyStore(t *testing.T) {
//		storetest.Run(t, storetest.Config{Open: func(t *testing.T) idemserver.Store {
//			s, err := mystore.Open(...)
//			if err != nil {
//				t.Fatal(err)
//			}
//			return s
//		}})
//	}
//
// The suite passes every time explicitly (whole seconds, UTC), so a store
// that keeps timestamps in a database column runs it as it is. A store
// that judges leases by a clock of its own (a database's) must let the
// suite's times stand in for that clock while it runs (pgstore does so in
// its tests).
//
// Besides claims, leases, replays and sweeps, the suite checks that
// completion and renewal are conditional on a live lease (a fenced
// handler's answer is refused) and that "done, not kept" records
// (Response.NotKept) round-trip.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/idemserver"
)

// t0 is the time the suite starts its clock at.
var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

const (
	fpA   = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	fpB   = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	lease = 30 * time.Second
	keep  = 24 * time.Hour
)

// Config says how to get stores under test, as the client side's
// storetest.Config does.
type Config struct {
	// Open returns a new, empty store for each call; Run closes every
	// store it opens.
	Open func(t *testing.T) idemserver.Store
}

// Run runs the conformance suite, each test as a subtest with a store of
// its own.
func Run(t *testing.T, c Config) {
	if c.Open == nil {
		t.Fatal("storetest: Config.Open is nil")
	}
	open := c.Open
	tests := []struct {
		name string
		fn   func(t *testing.T, s idemserver.Store)
	}{
		{"NewKeyIsAcquired", testAcquire},
		{"HeldKeyIsInFlight", testInFlight},
		{"OtherPayloadIsMismatch", testMismatch},
		{"CompletedKeyIsDone", testDone},
		{"ResponseRoundTrip", testRoundTrip},
		{"DoneExpiresAfterRetention", testRetention},
		{"LapsedLeaseIsTakenOver", testTakeover},
		{"RenewExtendsLease", testRenew},
		{"ReleaseFreesKey", testRelease},
		{"SettledTokenIsLost", testSettled},
		{"SweepDeletesExpired", testSweep},
		{"KeysAreIndependent", testIndependent},
		{"ConcurrentBeginAcquiresOnce", testConcurrent},
		{"CompleteAfterLapseIsLost", testCompleteAfterLapse},
		{"RenewAfterLapseIsLost", testRenewAfterLapse},
		{"NotKeptRoundTrip", testNotKept},
		{"HeldKeyOutlivesLease", testHeld},
		{"ClosedStoreRefuses", testClosed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := open(t)
			closed := false
			t.Cleanup(func() {
				if !closed {
					if err := s.Close(); err != nil {
						t.Errorf("Close: %v", err)
					}
				}
			})
			if tt.name == "ClosedStoreRefuses" {
				closed = true
			}
			tt.fn(t, s)
		})
	}
}

var ctx = context.Background()

func begin(t *testing.T, s idemserver.Store, id, fp string, now time.Time) idemserver.Claim {
	t.Helper()
	c, err := s.Begin(ctx, idemserver.Begin{ID: id, Fingerprint: fp, Now: now, LeaseUntil: now.Add(lease)})
	if err != nil {
		t.Fatalf("Begin(%s, at +%v): %v", id, now.Sub(t0), err)
	}
	return c
}

func acquire(t *testing.T, s idemserver.Store, id, fp string, now time.Time) string {
	t.Helper()
	c := begin(t, s, id, fp, now)
	if c.State != idemserver.StateAcquired || c.Token == "" {
		t.Fatalf("Begin(%s, at +%v) = %v token %q, want acquired with a token", id, now.Sub(t0), c.State, c.Token)
	}
	return c.Token
}

func wantState(t *testing.T, c idemserver.Claim, want idemserver.State) {
	t.Helper()
	if c.State != want {
		t.Fatalf("Begin state = %v, want %v", c.State, want)
	}
}

func wantLost(t *testing.T, op string, err error) {
	t.Helper()
	if !errors.Is(err, idemserver.ErrLockLost) {
		t.Fatalf("%s error = %v, want ErrLockLost", op, err)
	}
}

func must(t *testing.T, op string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", op, err)
	}
}

// complete calls s.Complete with the given arguments.
func complete(s idemserver.Store, id, token string, resp *idemserver.Response, now, until time.Time) error {
	return s.Complete(ctx, idemserver.Completion{ID: id, Token: token, Response: resp, Now: now, Until: until})
}

func okResponse() *idemserver.Response {
	return &idemserver.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/orders/1"}},
		Body:   []byte(`{"id":1}`),
	}
}

func testAcquire(t *testing.T, s idemserver.Store) {
	c := begin(t, s, "k1", fpA, t0)
	wantState(t, c, idemserver.StateAcquired)
	if c.Token == "" {
		t.Fatal("acquired claim has no token")
	}
	if !c.LeaseUntil.Equal(t0.Add(lease)) {
		t.Errorf("LeaseUntil = %v, want %v", c.LeaseUntil, t0.Add(lease))
	}
	if c.Response != nil {
		t.Errorf("acquired claim has a response")
	}
}

func testInFlight(t *testing.T, s idemserver.Store) {
	acquire(t, s, "k1", fpA, t0)
	c := begin(t, s, "k1", fpA, t0.Add(lease-time.Second))
	wantState(t, c, idemserver.StateInFlight)
	if !c.LeaseUntil.Equal(t0.Add(lease)) {
		t.Errorf("LeaseUntil = %v, want the holder's %v", c.LeaseUntil, t0.Add(lease))
	}
	if c.Token != "" {
		t.Errorf("in-flight claim leaks the holder's token")
	}
}

func testMismatch(t *testing.T, s idemserver.Store) {
	tok := acquire(t, s, "k1", fpA, t0)
	wantState(t, begin(t, s, "k1", fpB, t0.Add(time.Second)), idemserver.StateMismatch)
	must(t, "Complete", complete(s, "k1", tok, okResponse(), t0, t0.Add(keep)))
	wantState(t, begin(t, s, "k1", fpB, t0.Add(2*time.Second)), idemserver.StateMismatch)
	// The mismatch changed nothing.
	wantState(t, begin(t, s, "k1", fpA, t0.Add(3*time.Second)), idemserver.StateDone)
}

func testDone(t *testing.T, s idemserver.Store) {
	tok := acquire(t, s, "k1", fpA, t0)
	// Completing moves the expiry from the lease to the retention.
	must(t, "Complete", complete(s, "k1", tok, okResponse(), t0, t0.Add(keep)))
	c := begin(t, s, "k1", fpA, t0.Add(lease+time.Hour))
	wantState(t, c, idemserver.StateDone)
	if c.Token != "" {
		t.Errorf("done claim has a token")
	}
	checkResponse(t, c.Response, okResponse())
	// The response belongs to the caller.
	c.Response.Body[0] = 'X'
	c.Response.Header.Set("Location", "/elsewhere")
	c = begin(t, s, "k1", fpA, t0.Add(lease+time.Hour))
	checkResponse(t, c.Response, okResponse())
}

func checkResponse(t *testing.T, got, want *idemserver.Response) {
	t.Helper()
	if got == nil {
		t.Fatal("no response")
	}
	if got.Status != want.Status {
		t.Errorf("status = %d, want %d", got.Status, want.Status)
	}
	if string(got.Body) != string(want.Body) {
		t.Errorf("body = %q, want %q", got.Body, want.Body)
	}
	if len(got.Header) != len(want.Header) || (len(want.Header) > 0 && !reflect.DeepEqual(got.Header, want.Header)) {
		t.Errorf("header = %v, want %v", got.Header, want.Header)
	}
}

func testRoundTrip(t *testing.T, s idemserver.Store) {
	big := []byte(strings.Repeat("0123456789abcdef", 1<<16)) // 1 MiB
	cases := []*idemserver.Response{
		{Status: http.StatusOK},
		{Status: http.StatusNoContent, Header: http.Header{}, Body: []byte{}},
		{Status: http.StatusBadRequest, Header: http.Header{"Content-Type": {"application/problem+json"}}, Body: []byte(`{"title":"bad"}`)},
		{Status: http.StatusOK, Header: http.Header{"Link": {"<a>; rel=x", "<b>; rel=y"}, "Etag": {`"v1"`}}, Body: big},
		{Status: http.StatusCreated, Header: http.Header{"X-Bin": {"\x01é"}}, Body: []byte{0, 1, 2, 0xff}},
		// obs-text (bytes 0x80-0xff that are not UTF-8) is replayed as
		// it was answered, not as U+FFFD.
		{Status: http.StatusCreated, Header: http.Header{"X-Note": {"caf\xe9", "\xff"}}, Body: []byte("ok")},
	}
	for i, want := range cases {
		id := fmt.Sprintf("rt%d", i)
		tok := acquire(t, s, id, fpA, t0)
		must(t, "Complete", complete(s, id, tok, want, t0, t0.Add(keep)))
		c := begin(t, s, id, fpA, t0.Add(time.Minute))
		wantState(t, c, idemserver.StateDone)
		checkResponse(t, c.Response, want)
	}
}

func testRetention(t *testing.T, s idemserver.Store) {
	tok := acquire(t, s, "k1", fpA, t0)
	until := t0.Add(keep)
	must(t, "Complete", complete(s, "k1", tok, okResponse(), t0, until))
	wantState(t, begin(t, s, "k1", fpA, until.Add(-time.Second)), idemserver.StateDone)
	// At the expiry the record is gone, even for another payload.
	acquire(t, s, "k1", fpB, until)
}

func testTakeover(t *testing.T, s idemserver.Store) {
	old := acquire(t, s, "k1", fpA, t0)
	wantState(t, begin(t, s, "k1", fpA, t0.Add(lease-time.Second)), idemserver.StateInFlight)
	// The holder died; at the end of its lease the next request takes
	// over, with any payload.
	tok := acquire(t, s, "k1", fpB, t0.Add(lease))
	if tok == old {
		t.Fatal("takeover reused the old token")
	}
	wantLost(t, "Renew with the old token", s.Renew(ctx, "k1", old, t0.Add(lease), t0.Add(2*lease)))
	wantLost(t, "Complete with the old token", complete(s, "k1", old, okResponse(), t0.Add(lease), t0.Add(keep)))
	wantLost(t, "Release with the old token", s.Release(ctx, "k1", old))
	// The new holder is untouched by the old one's attempts.
	wantState(t, begin(t, s, "k1", fpB, t0.Add(lease+time.Second)), idemserver.StateInFlight)
	must(t, "Complete", complete(s, "k1", tok, okResponse(), t0.Add(lease+time.Second), t0.Add(keep)))
	wantState(t, begin(t, s, "k1", fpB, t0.Add(lease+2*time.Second)), idemserver.StateDone)
}

func testRenew(t *testing.T, s idemserver.Store) {
	tok := acquire(t, s, "k1", fpA, t0)
	must(t, "Renew", s.Renew(ctx, "k1", tok, t0, t0.Add(2*lease)))
	c := begin(t, s, "k1", fpA, t0.Add(lease))
	wantState(t, c, idemserver.StateInFlight)
	if !c.LeaseUntil.Equal(t0.Add(2 * lease)) {
		t.Errorf("LeaseUntil = %v, want the renewed %v", c.LeaseUntil, t0.Add(2*lease))
	}
	acquire(t, s, "k1", fpA, t0.Add(2*lease))
	wantLost(t, "Renew after the lease lapsed and was taken", s.Renew(ctx, "k1", tok, t0.Add(2*lease), t0.Add(3*lease)))
	wantLost(t, "Renew of an unknown key", s.Renew(ctx, "nokey", tok, t0, t0.Add(3*lease)))
}

func testRelease(t *testing.T, s idemserver.Store) {
	tok := acquire(t, s, "k1", fpA, t0)
	must(t, "Release", s.Release(ctx, "k1", tok))
	// Released well within the lease: the next request runs, any payload.
	tok2 := acquire(t, s, "k1", fpB, t0.Add(time.Second))
	if tok2 == tok {
		t.Fatal("a new claim reused the released token")
	}
}

func testSettled(t *testing.T, s idemserver.Store) {
	tok := acquire(t, s, "k1", fpA, t0)
	must(t, "Complete", complete(s, "k1", tok, okResponse(), t0, t0.Add(keep)))
	wantLost(t, "second Complete", complete(s, "k1", tok, okResponse(), t0, t0.Add(keep)))
	wantLost(t, "Release after Complete", s.Release(ctx, "k1", tok))
	wantLost(t, "Renew after Complete", s.Renew(ctx, "k1", tok, t0, t0.Add(keep)))
	wantState(t, begin(t, s, "k1", fpA, t0.Add(time.Second)), idemserver.StateDone)

	tok = acquire(t, s, "k2", fpA, t0)
	must(t, "Release", s.Release(ctx, "k2", tok))
	wantLost(t, "second Release", s.Release(ctx, "k2", tok))
	wantLost(t, "Complete after Release", complete(s, "k2", tok, okResponse(), t0, t0.Add(keep)))
	wantLost(t, "Complete with a made-up token", complete(s, "k3", "nosuchtoken", okResponse(), t0, t0.Add(keep)))
}

func testSweep(t *testing.T, s idemserver.Store) {
	// done1 expires at +1h, done2 at +24h; held lapses at +30s, live is
	// renewed to +2h.
	for _, r := range []struct {
		id    string
		until time.Duration
	}{{"done1", time.Hour}, {"done2", keep}} {
		tok := acquire(t, s, r.id, fpA, t0)
		must(t, "Complete", complete(s, r.id, tok, okResponse(), t0, t0.Add(r.until)))
	}
	acquire(t, s, "held", fpA, t0)
	live := acquire(t, s, "live", fpA, t0)
	must(t, "Renew", s.Renew(ctx, "live", live, t0, t0.Add(2*time.Hour)))

	n, err := s.Sweep(ctx, t0.Add(time.Second))
	must(t, "Sweep", err)
	if n != 0 {
		t.Errorf("Sweep at +1s deleted %d records, want 0", n)
	}
	n, err = s.Sweep(ctx, t0.Add(time.Hour))
	must(t, "Sweep", err)
	if n != 2 {
		t.Errorf("Sweep at +1h deleted %d records, want 2 (done1, held)", n)
	}
	// Swept records are gone; a lookup before their expiry (as a replica
	// with a slow clock would make) finds nothing.
	acquire(t, s, "done1", fpB, t0.Add(time.Minute))
	wantState(t, begin(t, s, "done2", fpA, t0.Add(time.Hour)), idemserver.StateDone)
	wantState(t, begin(t, s, "live", fpA, t0.Add(time.Hour)), idemserver.StateInFlight)
	must(t, "Complete of the live key after the sweep", complete(s, "live", live, okResponse(), t0.Add(time.Hour), t0.Add(keep)))

	n, err = s.Sweep(ctx, t0.Add(keep+time.Hour))
	must(t, "Sweep", err)
	if n != 3 {
		t.Errorf("Sweep at +25h deleted %d records, want 3 (done1 again, done2, live)", n)
	}
}

func testIndependent(t *testing.T, s idemserver.Store) {
	a := acquire(t, s, "a", fpA, t0)
	acquire(t, s, "b", fpA, t0)
	must(t, "Complete a", complete(s, "a", a, okResponse(), t0, t0.Add(keep)))
	wantState(t, begin(t, s, "a", fpA, t0.Add(time.Second)), idemserver.StateDone)
	wantState(t, begin(t, s, "b", fpA, t0.Add(time.Second)), idemserver.StateInFlight)
	// A long id of the size the middleware uses.
	long := strings.Repeat("f", 64)
	acquire(t, s, long, fpA, t0)
	wantState(t, begin(t, s, long[:63], fpA, t0), idemserver.StateAcquired)
}

func testConcurrent(t *testing.T, s idemserver.Store) {
	const n = 16
	var wg sync.WaitGroup
	claims := make([]idemserver.Claim, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			claims[i], errs[i] = s.Begin(ctx, idemserver.Begin{ID: "k1", Fingerprint: fpA, Now: t0, LeaseUntil: t0.Add(lease)})
		}()
	}
	wg.Wait()
	acquired := 0
	for i := range n {
		must(t, "Begin", errs[i])
		switch claims[i].State {
		case idemserver.StateAcquired:
			acquired++
		case idemserver.StateInFlight:
		default:
			t.Errorf("concurrent Begin state = %v", claims[i].State)
		}
	}
	if acquired != 1 {
		t.Errorf("%d of %d concurrent Begins acquired the key, want 1", acquired, n)
	}
}

func testClosed(t *testing.T, s idemserver.Store) {
	tok := acquire(t, s, "k1", fpA, t0)
	must(t, "Close", s.Close())
	_, err := s.Begin(ctx, idemserver.Begin{ID: "k2", Fingerprint: fpA, Now: t0, LeaseUntil: t0.Add(lease)})
	if !errors.Is(err, idemserver.ErrClosed) {
		t.Errorf("Begin after Close: %v, want ErrClosed", err)
	}
	if err := complete(s, "k1", tok, okResponse(), t0, t0.Add(keep)); !errors.Is(err, idemserver.ErrClosed) {
		t.Errorf("Complete after Close: %v, want ErrClosed", err)
	}
	if _, err := s.Sweep(ctx, t0); !errors.Is(err, idemserver.ErrClosed) {
		t.Errorf("Sweep after Close: %v, want ErrClosed", err)
	}
}

// testCompleteAfterLapse: completion is conditional on a live lease, even
// when nobody took the key over: a fenced handler's answer is refused.
func testCompleteAfterLapse(t *testing.T, s idemserver.Store) {
	tok := acquire(t, s, "k1", fpA, t0)
	wantLost(t, "Complete at the lease's end", complete(s, "k1", tok, okResponse(), t0.Add(lease), t0.Add(keep)))
	// The refused completion changed nothing: the lapsed key is free.
	acquire(t, s, "k1", fpA, t0.Add(lease))

	tok = acquire(t, s, "k2", fpA, t0)
	must(t, "Complete a nanosecond before the lease's end", complete(s, "k2", tok, okResponse(), t0.Add(lease-time.Nanosecond), t0.Add(keep)))
	wantState(t, begin(t, s, "k2", fpA, t0.Add(lease)), idemserver.StateDone)
}

// testRenewAfterLapse: a lease that lapsed cannot be renewed, even when
// nobody took the key over.
func testRenewAfterLapse(t *testing.T, s idemserver.Store) {
	tok := acquire(t, s, "k1", fpA, t0)
	wantLost(t, "Renew at the lease's end", s.Renew(ctx, "k1", tok, t0.Add(lease), t0.Add(2*lease)))
	acquire(t, s, "k1", fpA, t0.Add(lease))
}

// testNotKept: a "done, not kept" record round-trips with its status and
// without header or body, and is done, not in flight, for its retention.
func testNotKept(t *testing.T, s idemserver.Store) {
	for i, status := range []int{http.StatusCreated, 0} {
		id := fmt.Sprintf("nk%d", i)
		tok := acquire(t, s, id, fpA, t0)
		resp := okResponse()
		resp.Status, resp.NotKept = status, true
		must(t, "Complete", complete(s, id, tok, resp, t0, t0.Add(keep)))
		c := begin(t, s, id, fpA, t0.Add(time.Hour))
		wantState(t, c, idemserver.StateDone)
		if c.Response == nil || !c.Response.NotKept || c.Response.Status != status {
			t.Fatalf("not-kept record read back as %+v, want NotKept with status %d", c.Response, status)
		}
		if len(c.Response.Header) != 0 || len(c.Response.Body) != 0 {
			t.Errorf("not-kept record kept header %v and body %q", c.Response.Header, c.Response.Body)
		}
		wantState(t, begin(t, s, id, fpB, t0.Add(time.Hour)), idemserver.StateMismatch)
		acquire(t, s, id, fpA, t0.Add(keep))
	}
	// A kept response is not marked not-kept.
	tok := acquire(t, s, "kept", fpA, t0)
	must(t, "Complete", complete(s, "kept", tok, okResponse(), t0, t0.Add(keep)))
	if c := begin(t, s, "kept", fpA, t0.Add(time.Hour)); c.Response == nil || c.Response.NotKept {
		t.Errorf("kept response read back as %+v", c.Response)
	}
}

// testHeld checks a LocalStore's hold: a key claimed with BeginHeld stays
// in flight past its lease, is not swept, can be renewed and completed;
// once Unhold lets it go (with its own token only), its lease counts.
func testHeld(t *testing.T, s idemserver.Store) {
	ls, ok := s.(idemserver.LocalStore)
	if !ok {
		t.Skip("not a LocalStore: its keys are judged by their leases")
	}
	held := func(id string) string {
		t.Helper()
		c, err := ls.BeginHeld(ctx, idemserver.Begin{ID: id, Fingerprint: fpA, Now: t0, LeaseUntil: t0.Add(lease)})
		if err != nil || c.State != idemserver.StateAcquired || c.Token == "" {
			t.Fatalf("BeginHeld(%s) = %v token %q, %v; want acquired with a token", id, c.State, c.Token, err)
		}
		return c.Token
	}
	late := t0.Add(100 * lease)
	tok := held("k1")
	wantState(t, begin(t, s, "k1", fpA, late), idemserver.StateInFlight)
	if _, err := s.Sweep(ctx, late); err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	wantState(t, begin(t, s, "k1", fpA, late), idemserver.StateInFlight)
	must(t, "Renew of a held key past its lease", s.Renew(ctx, "k1", tok, late, late.Add(lease)))
	must(t, "Complete of a held key past its lease", complete(s, "k1", tok, okResponse(), late.Add(2*lease), late.Add(keep)))
	wantState(t, begin(t, s, "k1", fpA, late.Add(2*lease)), idemserver.StateDone)

	tok2 := held("k2")
	ls.Unhold("k2", tok2+"x") // another token's: no effect
	wantState(t, begin(t, s, "k2", fpA, late), idemserver.StateInFlight)
	ls.Unhold("k2", tok2)
	acquire(t, s, "k2", fpA, t0.Add(lease)) // its lease counts again
}
