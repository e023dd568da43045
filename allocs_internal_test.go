package idem

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptrace"
	"path/filepath"
	"testing"
)

// allocBase is a base RoundTripper that does what net/http does with a
// request, as far as idem sees it (it reports the header written through
// the request's httptrace, reads the body to its end and closes it),
// without allocating: its answer is made once.
type allocBase struct {
	resp   http.Response
	writes int
}

func (b *allocBase) RoundTrip(r *http.Request) (*http.Response, error) {
	if tr := httptrace.ContextClientTrace(r.Context()); tr != nil && tr.WroteHeaders != nil {
		tr.WroteHeaders()
	}
	b.writes++
	if r.Body != nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	b.resp = http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}
	return &b.resp, nil
}

// rewindable is a request body that a test can refill without
// allocating.
type rewindable struct{ bytes.Reader }

func (*rewindable) Close() error { return nil }

// keyedAllocs returns the allocations of one keyed POST with a small body
// through a Client on store, its answer delivered and settled, minus the
// two of the key (a UUIDv7 and its text), which bare net/http pays too
// when the caller makes the key.
func keyedAllocs(t *testing.T, store KeyStore) float64 {
	t.Helper()
	base := &allocBase{}
	c := New(store, WithBaseTransport(base))
	defer c.Close()
	tr := c.Transport()
	payload := []byte(`{"amount":1999,"currency":"eur","customer":"cus_9s6XKzkNRiz8i3","description":"order 42"}`)
	var body rewindable
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://127.0.0.1:1/v1/charges", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.ContentLength = int64(len(payload))
	send := func() {
		body.Reset(payload)
		req.Body = &body
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	for range 200 { // the store's maps grow to their size
		send()
	}
	n := testing.AllocsPerRun(200, send)
	if base.writes != 400+1 {
		t.Fatalf("%d requests written, want %d", base.writes, 401)
	}
	return n - 2
}

// TestKeyedRequestAllocations bounds what idem adds to a keyed request,
// beyond the key: with the memory store, the body, the outgoing header
// map with its group, the operation (which holds the request copy, the
// in-flight entry and the first attempt's body reader), the context that
// carries its trace (httptrace.WithClientTrace's), the trace hook, GetBody, the boxing of that reader, and a share of a block
// of the store's records; the journaled header and URL are shared with
// the request before, which had the same. With the bbolt journal, also
// what one Reserve and one Finish cost, mostly bbolt's own (a cursor
// stack per Put, key copies, nodes, free list), with a commit per request
// here. The bbolt count depends a little on how the finish marks fall
// into commits, hence its margin.
func TestKeyedRequestAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector")
	}
	t.Run("memory", func(t *testing.T) {
		n, want := keyedAllocs(t, NewMemoryStore()), 9.0
		t.Logf("%v allocations besides the key", n)
		if n > want {
			t.Errorf("a keyed request allocates %v times besides its key, want at most %v", n, want)
		}
	})
	t.Run("bbolt", func(t *testing.T) {
		s, err := OpenBoltStore(filepath.Join(t.TempDir(), "j.db"), nil)
		if err != nil {
			t.Fatal(err)
		}
		n, want := keyedAllocs(t, s), 82.0
		t.Logf("%v allocations besides the key", n)
		if n > want {
			t.Errorf("a keyed request allocates %v times besides its key, want at most %v", n, want)
		}
	})
}

// TestTraceBesideCallersTrace checks the context idem's requests carry:
// the caller's values and trace are seen by the base RoundTripper, and the
// requests written are counted both by the caller's trace and by idem,
// whether the caller's context has a trace or not.
func TestTraceBesideCallersTrace(t *testing.T) {
	type ctxKey struct{}
	for _, own := range []bool{false, true} {
		base := &allocBase{}
		var seen any
		c := New(NewMemoryStore(), WithBaseTransport(baseFunc(func(r *http.Request) (*http.Response, error) {
			seen = r.Context().Value(ctxKey{})
			return base.RoundTrip(r)
		})))
		ctx := context.WithValue(context.Background(), ctxKey{}, "v")
		callers := 0
		if own {
			ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: func() { callers++ }})
		}
		ctx = WithKey(ctx, "trace-key")
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://127.0.0.1:1/", bytes.NewReader([]byte("x")))
		resp, err := c.HTTPClient().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		op, err := c.t.j.store.Get(context.Background(), "trace-key")
		if err != nil {
			t.Fatal(err)
		}
		if op.Attempts != 1 || seen != "v" || own && callers != 1 {
			t.Errorf("own trace %v: %d attempts recorded, value %v, caller's trace called %d times", own, op.Attempts, seen, callers)
		}
		c.Close()
	}
}

type baseFunc func(*http.Request) (*http.Response, error)

func (f baseFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
