package idem_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// TestUnsendableKeyHeaderName: a key header name that is not an HTTP
// token can never be sent; the request is refused before anything is
// journaled, and a value with a horizontal tab (which net/http sends) is
// not refused.
func TestUnsendableKeyHeaderName(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &scriptRT{steps: []step{resp(201)}}
		c, store := newTestClient(rt, idem.WithKeyHeader("Idempotency Key"))
		defer c.Close()
		_, err := post(t, context.Background(), c.HTTPClient(), `{"n":1}`)
		require.ErrorIs(t, err, idem.ErrInvalidRequest)
		assert.Empty(t, rt.sent)
		assert.Zero(t, store.Len(), "nothing journaled")

		c2, _ := newTestClient(rt)
		defer c2.Close()
		req, err := http.NewRequest(http.MethodPost, "https://pay.example/v1/charges", strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set("X-Note", "a\tb")
		r, err := c2.HTTPClient().Do(req)
		require.NoError(t, err, "a tab is a valid header value byte")
		r.Body.Close()
	})
}

// TestContentLengthMismatch: a body whose length is not its
// ContentLength can never be sent (net/http refuses it); it is refused
// with ErrInvalidRequest before anything is journaled.
func TestContentLengthMismatch(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		length int64
		opts   []idem.Option
		large  bool // with a GetBody over the journal's limit
	}{
		{"shorter", "12345", 10, nil, false},
		{"longer", "1234567890", 5, nil, false},
		{"large, GetBody shorter", strings.Repeat("x", 16), 20, []idem.Option{idem.WithMaxBodyBytes(8), idem.WithUnjournaledLargeBodies()}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt := &scriptRT{steps: []step{resp(201)}}
				c, store := newTestClient(rt, tt.opts...)
				defer c.Close()
				req, err := http.NewRequest(http.MethodPost, "https://pay.example/v1/charges", strings.NewReader(tt.body))
				require.NoError(t, err)
				req.ContentLength = tt.length
				if !tt.large {
					req.GetBody = nil
				}
				_, err = c.Transport().RoundTrip(req)
				require.ErrorIs(t, err, idem.ErrInvalidRequest, "error: %v", err)
				assert.Empty(t, rt.sent)
				assert.Zero(t, store.Len(), "nothing journaled")
			})
		})
	}
}

// TestGetBodyNil: a GetBody that returns neither a body nor an error is
// an error, not a panic, and the call is not left counted (Shutdown does
// not wait for it).
func TestGetBodyNil(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &scriptRT{steps: []step{resp(201)}}
		c, _ := newTestClient(rt, idem.WithMaxBodyBytes(8), idem.WithUnjournaledLargeBodies())
		big := strings.Repeat("x", 16)
		req, err := http.NewRequest(http.MethodPost, "https://pay.example/v1/uploads", strings.NewReader(big))
		require.NoError(t, err)
		req.GetBody = func() (io.ReadCloser, error) { return nil, nil }
		var rerr error
		require.NotPanics(t, func() { _, rerr = c.Transport().RoundTrip(req) })
		require.ErrorIs(t, rerr, idem.ErrInvalidRequest)
		assert.Empty(t, rt.sent)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		assert.NoError(t, c.Shutdown(ctx), "no call is left counted")
	})
}

// failingReserve is a store whose reservations fail with an error that
// names the key, as a store's errors do.
type failingReserve struct {
	*idem.MemoryStore
	mu   sync.Mutex
	keys []string
}

func (f *failingReserve) Reserve(_ context.Context, op idem.Operation) (idem.Operation, bool, error) {
	f.mu.Lock()
	f.keys = append(f.keys, op.Key)
	f.mu.Unlock()
	return idem.Operation{}, false, fmt.Errorf("reserve %s: disk full: %w", op.Key, idem.ErrJournalWrite)
}

// TestErrorShowsOnlyJournaledKeys: the text of an error never shows a key
// that was not journaled: neither a candidate key whose reservation failed
// nor a caller's invalid key.
func TestErrorShowsOnlyJournaledKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &scriptRT{steps: []step{resp(201)}}
		store := &failingReserve{MemoryStore: idem.NewMemoryStore()}
		c := idem.New(store, idem.WithBaseTransport(rt))
		defer c.Close()
		for _, ctx := range []context.Context{context.Background(), idem.WithOperation(context.Background(), "pay:1")} {
			_, err := post(t, ctx, c.HTTPClient(), `{"n":1}`)
			require.ErrorIs(t, err, idem.ErrJournalWrite)
			var ie *idem.Error
			require.ErrorAs(t, err, &ie)
			assert.Empty(t, ie.Key)
			store.mu.Lock()
			cand := store.keys[len(store.keys)-1]
			store.mu.Unlock()
			assert.NotContains(t, err.Error(), cand, "the error shows a key that was never journaled")
			assert.Contains(t, err.Error(), "disk full", "and keeps the store's reason")
		}
		_, err := post(t, idem.WithKey(context.Background(), "bad key"), c.HTTPClient(), `{"n":1}`)
		require.ErrorIs(t, err, idem.ErrInvalidKey)
		assert.NotContains(t, err.Error(), "bad key")
		assert.Empty(t, rt.sent)
	})
}

// TestConflictBodyStalls: reading a 409's body to tell "in progress" from
// "key already used" is bounded in time: a body that stalls counts as "in
// progress", is closed, and the call goes on to its next attempt.
func TestConflictBodyStalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		stalled := idem.NewStalledBody()
		var n int
		rt := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			io.Copy(io.Discard, r.Body)
			n++
			if n == 1 {
				return &http.Response{StatusCode: http.StatusConflict, Header: http.Header{}, Body: stalled, Request: r}, nil
			}
			return &http.Response{StatusCode: http.StatusCreated, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
		})
		c, _ := newTestClient(rt, idem.WithMaxAttempts(2))
		defer c.Close()
		r, err := post(t, context.Background(), c.HTTPClient(), `{"n":1}`)
		require.NoError(t, err)
		r.Body.Close()
		assert.Equal(t, http.StatusCreated, r.StatusCode)
		assert.Equal(t, 2, n)
		select {
		case <-stalled.Closed():
		default:
			t.Error("the stalled 409 body was not closed")
		}
	})
}

// TestFinal409StaysInDoubt: a 409 "in progress" that ends a call's
// attempts says a request under the key is still being handled: the
// operation stays pending, never failed, and Resume finishes it.
func TestFinal409StaysInDoubt(t *testing.T) {
	for _, resend := range []bool{false, true} {
		t.Run(fmt.Sprintf("resend=%v", resend), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				steps := []step{resp(409), resp(409), resp(201)}
				if resend {
					steps = append([]step{fail(errReset), fail(errReset)}, steps...)
				}
				rt := &scriptRT{steps: steps}
				c, store := newTestClient(rt, idem.WithMaxAttempts(2))
				defer c.Close()
				ctx := idem.WithOperation(context.Background(), "pay:409")
				if resend {
					_, err := post(t, ctx, c.HTTPClient(), `{"n":1}`)
					require.ErrorIs(t, err, idem.ErrAttemptsExhausted)
				}
				r, err := post(t, ctx, c.HTTPClient(), `{"n":1}`)
				require.NoError(t, err)
				require.Equal(t, http.StatusConflict, r.StatusCode)
				io.Copy(io.Discard, r.Body)
				r.Body.Close()
				op, err := store.Named(context.Background(), "pay:409")
				require.NoError(t, err)
				assert.Equal(t, idem.StatePending, op.State, "a 409 in progress is no outcome")
				assert.Len(t, pendingOf(t, store), 1)

				fn, got := collect()
				require.NoError(t, c.Resume(context.Background(), fn))
				require.Len(t, got.list(), 1)
				assert.Equal(t, http.StatusCreated, got.list()[0].status)
				op, err = store.Named(context.Background(), "pay:409")
				require.NoError(t, err)
				assert.Equal(t, idem.StateSucceeded, op.State)
			})
		})
	}
}

// TestPanickingHook: a hook that panics does not leave its operation in
// flight: its ending is written first, so a re-drive of the name goes
// ahead at once and Shutdown has no call to wait for.
func TestPanickingHook(t *testing.T) {
	tests := []struct {
		name  string
		hooks *idem.Hooks
		steps []step
		state idem.State
	}{
		{"Settled", &idem.Hooks{Settled: func(idem.OperationInfo) { panic("hook bug") }}, []step{resp(201)}, idem.StateSucceeded},
		{"AttemptDone after a lost answer", &idem.Hooks{AttemptDone: func(idem.AttemptInfo) { panic("hook bug") }}, []step{fail(errReset)}, idem.StatePending},
		{"InDoubt", &idem.Hooks{InDoubt: func(idem.OperationInfo, error) { panic("hook bug") }}, []step{fail(errReset)}, idem.StatePending},
		{"RetryScheduled", &idem.Hooks{RetryScheduled: func(idem.RetryInfo) { panic("hook bug") }}, []step{resp(503)}, idem.StatePending},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt := &scriptRT{steps: tt.steps}
				c, store := newTestClient(rt, idem.WithMaxAttempts(2))
				ctx := idem.WithOperation(context.Background(), "pay:hook")
				assert.Panics(t, func() {
					r, err := post(t, idem.WithRequestHooks(ctx, tt.hooks), c.HTTPClient(), `{"n":1}`)
					if err == nil {
						io.Copy(io.Discard, r.Body)
						r.Body.Close()
					}
				})
				op, err := store.Named(context.Background(), "pay:hook")
				require.NoError(t, err)
				assert.Equal(t, tt.state, op.State)

				rt.mu.Lock()
				rt.steps = []step{resp(201)}
				rt.mu.Unlock()
				r, err := post(t, ctx, c.HTTPClient(), `{"n":1}`)
				require.NoError(t, err, "the re-drive does not wait for an operation the panic left in flight")
				r.Body.Close()
				done, cancel := context.WithCancel(context.Background())
				cancel()
				assert.NoError(t, c.Shutdown(done), "no call left in flight")
			})
		})
	}
}

// TestShutdownReportsWhatHappened: a Shutdown whose context has ended
// with nothing running reports nothing (it used to say, at random, that a
// Resume was still running).
func TestShutdownReportsWhatHappened(t *testing.T) {
	for range 50 {
		c, _ := newTestClient(&scriptRT{steps: []step{resp(201)}})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		require.NoError(t, c.Shutdown(ctx))
	}
}

// TestResumeSkipsSettledClaim: an operation Resume claimed but a live
// call settled before Resume came to it is neither sent again nor handed
// to Resume's handler.
func TestResumeSkipsSettledClaim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			mu      sync.Mutex
			sent    = map[string]int{}
			blocked string
		)
		release := make(chan struct{})
		resuming := false
		rt := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			sent[string(b)]++
			block := resuming && blocked == ""
			if block {
				blocked = string(b)
			}
			lost := !resuming
			mu.Unlock()
			if lost {
				return nil, errReset
			}
			if block {
				<-release
			}
			return &http.Response{StatusCode: 201, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
		})
		c, _ := newTestClient(rt, idem.WithMaxAttempts(1), idem.WithResumeConcurrency(1))
		defer c.Close()
		for _, n := range []string{"a", "b"} {
			_, err := post(t, idem.WithOperation(context.Background(), n), c.HTTPClient(), n)
			require.ErrorIs(t, err, idem.ErrAttemptsExhausted)
		}
		mu.Lock()
		resuming = true
		mu.Unlock()
		fn, got := collect()
		done := make(chan error)
		go func() { done <- c.Resume(context.Background(), fn) }()
		synctest.Wait() // Resume claimed both and is sending one of them
		mu.Lock()
		other := map[string]string{"a": "b", "b": "a"}[blocked]
		mu.Unlock()
		require.NotEmpty(t, other)
		r, err := post(t, idem.WithOperation(context.Background(), other), c.HTTPClient(), other)
		require.NoError(t, err)
		r.Body.Close()
		close(release)
		require.NoError(t, <-done)
		require.Len(t, got.list(), 1, "only the operation Resume sent is handed to its handler")
		assert.Equal(t, blocked, got.list()[0].op.Name)
		mu.Lock()
		assert.Equal(t, 2, sent[other], "sent by the first call and the live re-drive only")
		mu.Unlock()
	})
}

// TestResumePrepareUnsendable: credentials a WithResumePrepare hook adds
// are checked like any header: an unsendable one is not sent, and the
// operation stays pending for a fixed hook.
func TestResumePrepareUnsendable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &scriptRT{steps: []step{fail(errReset)}}
		c, store := newTestClient(rt, idem.WithMaxAttempts(1), idem.WithResumePrepare(func(r *http.Request) error {
			r.Header.Set("Authorization", "Bearer \x01bad")
			return nil
		}))
		defer c.Close()
		req, err := http.NewRequest(http.MethodPost, "https://pay.example/v1/charges", strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer good")
		_, err = c.HTTPClient().Do(req)
		require.ErrorIs(t, err, idem.ErrAttemptsExhausted)
		n := len(rt.keys())
		fn, got := collect()
		require.NoError(t, c.Resume(context.Background(), fn))
		require.Len(t, got.list(), 1)
		assert.ErrorIs(t, got.list()[0].err, idem.ErrInvalidRequest)
		assert.Len(t, rt.keys(), n, "nothing sent")
		assert.Len(t, pendingOf(t, store), 1, "still pending")
	})
}
