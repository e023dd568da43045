package chaoskit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemtest"
)

// journal is a Lookup over a map of operations by name.
func journal(ops map[string]idem.Operation) Lookup {
	return func(_ context.Context, name string) (idem.Operation, error) {
		if op, ok := ops[name]; ok {
			return op, nil
		}
		return idem.Operation{}, idem.ErrNotFound
	}
}

func TestTally(t *testing.T) {
	st := idemtest.Stats{Requests: 9, Runs: 4, Replays: 1, Conflicts: 2, RunsByKey: map[string]int{"k1": 1, "k2": 2}}
	l := Tally(st, []int{1, 0, 3, 1})
	assert.Equal(t, 4, l.Ops)
	assert.Equal(t, 3, l.Paid)
	assert.Equal(t, 1, l.Lost)
	assert.Equal(t, 1, l.Duplicates)
	assert.Equal(t, 9, l.Requests)

	// A key run twice is a duplicate even if no payload was.
	st.RunsByKey["k3"], st.RunsByKey["k4"] = 2, 2
	assert.Equal(t, 3, Tally(st, []int{1, 1}).Duplicates)
}

func TestLedgerJournal(t *testing.T) {
	st := idemtest.Stats{
		RunsByKey:     map[string]int{"ka": 1, "kb": 2, "kc": 1, "unnamed": 1},
		AttemptsByKey: map[string]int{"ka": 1, "kb": 2, "kc": 1, "stray": 1, "unnamed": 1},
	}
	ops := map[string]idem.Operation{
		"a": {Key: "ka", State: idem.StateSucceeded},
		"b": {Key: "kb", State: idem.StateSucceeded}, // run twice under its key
		"c": {Key: "kc", State: idem.StatePending},
	}
	l := Tally(st, []int{1, 1, 1, 1})
	require.NoError(t, l.Named(t.Context(), journal(ops), []string{"a", "b", "c", "d"}))
	assert.Equal(t, 2, l.NotSucceeded, "c pending, d missing")
	assert.Equal(t, 1, l.WrongKey, "b")
	l.Foreign(func(key string, runs int) bool { return key == "unnamed" && runs == 1 })
	assert.Equal(t, 1, l.ForeignKeys, "stray")

	broken := func(context.Context, string) (idem.Operation, error) { return idem.Operation{}, errors.New("away") }
	assert.ErrorContains(t, Tally(st, nil).Named(t.Context(), broken, []string{"a"}), "away")
}

// recorder is a testing.TB that records failures instead of failing.
type recorder struct {
	testing.TB
	failures []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}
func (r *recorder) Helper() {}

func TestAssertFailsEveryBrokenCount(t *testing.T) {
	clean := func() *Ledger { return &Ledger{Ops: 3, Runs: 3} }
	var r recorder
	clean().Assert(&r)
	require.Empty(t, r.failures, "a clean ledger passes")
	for name, breakIt := range map[string]func(*Ledger){
		"duplicates":    func(l *Ledger) { l.Duplicates = 1 },
		"lost":          func(l *Ledger) { l.Lost = 1 },
		"not succeeded": func(l *Ledger) { l.NotSucceeded = 1 },
		"pending":       func(l *Ledger) { l.Pending = 1 },
		"foreign keys":  func(l *Ledger) { l.ForeignKeys = 1 },
		"wrong key":     func(l *Ledger) { l.WrongKey = 1 },
		"runs":          func(l *Ledger) { l.Runs = 4 },
	} {
		l := clean()
		breakIt(l)
		r := recorder{TB: t}
		l.Assert(&r)
		assert.Len(t, r.failures, 1, name)
	}
}

func TestScan(t *testing.T) {
	said := Scan([]string{"todo 3", "send k", "resumed a 201", "gaveup b", "resumed c error", "fatal no journal", "complete"})
	assert.Equal(t, Lines{Resumed: 2, GaveUp: 1, Complete: true, Fatal: []string{"no journal"}}, said)
	assert.False(t, Scan([]string{"todo 3"}).Complete)
}

func TestKillPoint(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100 {
		p := KillPoint(rng, 10, 4, 1)
		assert.True(t, p >= 1 && p <= 20, "kill point %d of 10 ops, 4 lines each, 1 kill left", p)
	}
	assert.Equal(t, 1, KillPoint(rng, 0, 4, 3), "nothing to do: after the first line")
}

func TestPool(t *testing.T) {
	ch := make(chan int, 10)
	failed := Pool(3, slices.Values([]int{1, 2, 3, 4, 5, 6}), func(i int) bool {
		ch <- i
		return i%2 == 0
	})
	close(ch)
	var got []int
	for i := range ch {
		got = append(got, i)
	}
	slices.Sort(got)
	assert.Equal(t, []int{1, 2, 3, 4, 5, 6}, got)
	assert.Equal(t, 3, failed)
}

func TestTry(t *testing.T) {
	calls := 0
	assert.True(t, Try(t.Context(), 5, time.Microsecond, func(try int) (bool, error) {
		calls++
		return try == 2, nil
	}))
	assert.Equal(t, 3, calls)

	calls = 0
	assert.False(t, Try(t.Context(), 4, time.Microsecond, func(int) (bool, error) { calls++; return false, nil }))
	assert.Equal(t, 4, calls, "bounded")

	calls = 0
	assert.False(t, Try(t.Context(), 4, time.Microsecond, func(int) (bool, error) { calls++; return false, errors.New("bad request") }))
	assert.Equal(t, 1, calls, "an error ends the tries")

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	calls = 0
	assert.False(t, Try(ctx, 4, time.Hour, func(int) (bool, error) { calls++; return false, nil }))
	assert.Equal(t, 1, calls, "the context's end stops the pause")
}

func TestAnswer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fail" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprint(w, `{"order":"order-1"}`)
	}))
	defer srv.Close()
	get := func(path string) *http.Response {
		req, err := Post(t.Context(), srv.URL+path, "{}")
		require.NoError(t, err)
		assert.Equal(t, "application/json", req.Header.Get("Content-Type"))
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		return resp
	}
	assert.True(t, Answer(get("/"), "order-1"))
	assert.False(t, Answer(get("/"), "order-2"), "another order's answer")
	assert.False(t, Answer(get("/fail"), "order-1"), "not a 2xx")
	assert.False(t, Answer(get("/"), 1), "not an int order")
	assert.Equal(t, "error", Status(nil))
}

func TestLedgerString(t *testing.T) {
	l := Tally(idemtest.Stats{Requests: 3, Faults: map[idemtest.Fault]int{idemtest.DropAfter: 1, idemtest.Delay: 2}}, []int{1, 1})
	s := l.String()
	assert.True(t, strings.HasPrefix(s, "2 operations, 3 requests (1.500 per operation)"), s)
	assert.Contains(t, s, "faults [delay 2, drop-after 1]")
}

func TestProvider(t *testing.T) {
	srv := Provider(idemtest.FaultRates{})
	defer srv.Close()
	post := func(key, body string) *http.Response {
		req, err := Post(t.Context(), srv.URL+"/v1/orders", body)
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", key)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		return resp
	}
	assert.True(t, Answer(post("k1", `{"order":"order-1"}`), "order-1"))
	bad := post("k2", `{"amount":1}`)
	assert.Equal(t, http.StatusBadRequest, bad.StatusCode, "an order without a name")
	assert.False(t, Answer(bad, "order-1"))
	assert.Equal(t, 1, srv.Stats().RunsByKey["k1"])
}
