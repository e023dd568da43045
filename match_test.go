package idem_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemtest"
	"github.com/idemgo/idem/internal/logtest"
)

// chargeServer is an idemtest server whose handler counts its effects
// ("charge n"); the first key it sees meets faults, one per attempt, and
// first returns that key. It closes with the test.
func chargeServer(t *testing.T, faults ...idemtest.Fault) (srv *idemtest.Server, first func() string) {
	t.Helper()
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "charge %d", runs.Add(1))
	})
	var (
		mu       sync.Mutex
		firstKey string
	)
	srv = idemtest.NewServer(h, idemtest.WithRetryAfter(0), idemtest.WithScript(func(key string, attempt int) idemtest.Fault {
		mu.Lock()
		defer mu.Unlock()
		if firstKey == "" {
			firstKey = key
		}
		if key == firstKey && attempt <= len(faults) {
			return faults[attempt-1]
		}
		return idemtest.NoFault
	}))
	t.Cleanup(srv.Close)
	return srv, func() string { mu.Lock(); defer mu.Unlock(); return firstKey }
}

// TestResendAfterResumeKeepsKey: a call left in doubt, then finished by
// Resume (explicit or in the background) before the SDK's own retry
// arrives, is still the same logical call: Resume's handler is not the
// caller, so the retry reuses the key and gets the server's stored answer.
// One key, one effect.
func TestResendAfterResumeKeepsKey(t *testing.T) {
	for _, background := range []bool{false, true} {
		t.Run(fmt.Sprintf("background=%v", background), func(t *testing.T) {
			srv, first := chargeServer(t, idemtest.DropAfter)
			store := idem.NewMemoryStore()
			resumed := make(chan idem.Operation, 1)
			fn := func(op idem.Operation, resp *http.Response, err error) {
				if resp != nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				select {
				case resumed <- op:
				default:
				}
			}
			opts := []idem.Option{idem.WithBaseTransport(srv.Client().Transport), idem.WithMaxAttempts(1)}
			if background {
				opts = append(opts, idem.WithBackgroundResume(5*time.Millisecond, fn))
			}
			c := idem.New(store, opts...)
			defer c.Close()
			hc := c.HTTPClient()
			url := srv.URL + "/v1/chat/completions"

			status, _, err := sdkCall(t, hc, url, `{"model":"m"}`, 1)
			require.Error(t, err, "the first attempt's answer is lost")
			require.Zero(t, status)
			key := first()
			require.NotEmpty(t, key)

			if background {
				// The guard only keeps a broken build from hanging.
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				select {
				case <-resumed:
				case <-ctx.Done():
					t.Fatal("the background Resume never ran")
				}
			} else {
				require.NoError(t, c.Resume(context.Background(), fn))
				require.Len(t, resumed, 1)
			}
			op, err := store.Get(context.Background(), key)
			require.NoError(t, err)
			require.Equal(t, idem.StateSucceeded, op.State, "Resume finished the operation")

			// The SDK's retry of the same call (a fresh RoundTrip, a retry
			// counter) arrives now.
			req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"model":"m"}`))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Stainless-Retry-Count", "1")
			resp, err := hc.Do(req)
			require.NoError(t, err)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
			assert.Equal(t, "charge 1", string(b), "the retry gets the stored answer")
			assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"))

			st := srv.Stats()
			assert.Len(t, st.AttemptsByKey, 1, "one key: %v", st.AttemptsByKey)
			assert.Equal(t, 1, st.Runs, "one effect")
			assert.Equal(t, 0, st.DuplicatePayloads())

			// The caller received that answer: the next identical call is
			// a new operation.
			status, body, err := sdkCall(t, hc, url, `{"model":"m"}`, 1)
			require.NoError(t, err)
			assert.Equal(t, http.StatusCreated, status)
			assert.Equal(t, "charge 2", body)
			assert.Len(t, srv.Stats().AttemptsByKey, 2)
		})
	}
}

// firstLostRT loses the answer to the first request of every body (the
// server performed it) and answers 201 to the others. It records the key
// of every request per body.
type firstLostRT struct {
	mu   sync.Mutex
	keys map[string][]string
}

func (f *firstLostRT) RoundTrip(r *http.Request) (*http.Response, error) {
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.keys == nil {
		f.keys = make(map[string][]string)
	}
	f.keys[string(b)] = append(f.keys[string(b)], r.Header.Get("Idempotency-Key"))
	if len(f.keys[string(b)]) == 1 {
		return nil, errReset
	}
	return &http.Response{StatusCode: http.StatusCreated, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
}

// keysFor returns the keys sent for body.
func (f *firstLostRT) keysFor(body string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.keys[body]...)
}

// TestResendMatchHoldsManyCalls: during an outage, every call in doubt
// within the window is remembered, however many there are (up to the
// limit), so each SDK retry reuses its call's key.
func TestResendMatchHoldsManyCalls(t *testing.T) {
	const calls = 4500
	rt := &firstLostRT{}
	c := idem.New(idem.NewMemoryStore(), idem.WithBaseTransport(rt), idem.WithMaxAttempts(1))
	defer c.Close()
	hc := c.HTTPClient()
	body := func(i int) string { return fmt.Sprintf(`{"order":%d}`, i) }
	for i := range calls {
		_, err := post(t, context.Background(), hc, body(i))
		require.ErrorIs(t, err, idem.ErrAttemptsExhausted)
	}
	assert.Equal(t, idem.ResendMatchStats{Held: calls}, c.ResendMatchStats())
	split := 0
	for i := range calls {
		r, err := post(t, context.Background(), hc, body(i))
		require.NoError(t, err)
		r.Body.Close()
		if k := rt.keysFor(body(i)); len(k) != 2 || k[0] != k[1] {
			split++
		}
	}
	assert.Zero(t, split, "calls whose resend got a new key")
	assert.Equal(t, idem.ResendMatchStats{}, c.ResendMatchStats(), "every caller received its answer")
}

// TestResendMatchLimitEvictsOldest: beyond WithResendMatchLimit the call
// that ended in doubt longest ago is forgotten first (a call in doubt
// again counts from its latest end), each eviction is counted, and the
// first is logged.
func TestResendMatchLimitEvictsOldest(t *testing.T) {
	rt := &firstLostRT{}
	logs := &logtest.Records{}
	c := idem.New(idem.NewMemoryStore(), idem.WithBaseTransport(rt), idem.WithMaxAttempts(1),
		idem.WithResendMatchLimit(3), idem.WithLogger(slog.New(logs)))
	defer c.Close()
	hc := c.HTTPClient()
	inDoubt := func(body string) {
		t.Helper()
		_, err := post(t, context.Background(), hc, body)
		require.ErrorIs(t, err, idem.ErrAttemptsExhausted)
	}
	inDoubt("a")
	inDoubt("b")
	inDoubt("c")
	// a's resend is in doubt again: it is now the newest.
	rt.mu.Lock()
	rt.keys["a"] = nil
	rt.mu.Unlock()
	inDoubt("a")
	inDoubt("d") // evicts b, the oldest
	inDoubt("e") // evicts c
	assert.Equal(t, idem.ResendMatchStats{Held: 3, Evicted: 2}, c.ResendMatchStats())
	assert.Len(t, logs.Find(matchFullMsg), 1, "logged once")

	for _, b := range []string{"a", "b", "c", "d", "e"} {
		r, err := post(t, context.Background(), hc, b)
		require.NoError(t, err)
		r.Body.Close()
	}
	same := func(b string) bool { k := rt.keysFor(b); return k[len(k)-1] == k[len(k)-2] }
	assert.True(t, same("a"), "a was refreshed")
	assert.False(t, same("b"), "b was evicted")
	assert.False(t, same("c"), "c was evicted")
	assert.True(t, same("d"))
	assert.True(t, same("e"))
}

const matchFullMsg = "idem: resend match index is full; the oldest calls in doubt are forgotten, so their resends get new keys (raise WithResendMatchLimit)"

// userKey carries an end user's id in a request's context.
type userKey struct{}

// TestWhatIdentifiesACall: a call in doubt is matched by a later call
// only when everything but the volatile headers is the same, principal
// included: tenant and account headers keep calls apart, retry counters,
// trace context, dates, request ids and user agents do not; end users
// are kept apart by WithPrincipal, which also matches calls whose
// credentials are signed afresh for every request.
func TestWhatIdentifiesACall(t *testing.T) {
	jwt := func(sub string, jti int) string {
		return fmt.Sprintf("Bearer sub=%s;iat=%d;jti=%d", sub, 1700000000+jti, jti)
	}
	bySub := func(r *http.Request) string {
		tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		sub, _, _ := strings.Cut(strings.TrimPrefix(tok, "sub="), ";")
		return sub
	}
	byUser := func(r *http.Request) string { u, _ := r.Context().Value(userKey{}).(string); return u }
	type call struct {
		header map[string]string
		user   string
	}
	tests := []struct {
		name        string
		opts        []idem.Option
		first, then call
		sameKey     bool
	}{
		{"identical", nil, call{}, call{}, true},
		{"retry counter", nil, call{}, call{header: map[string]string{"X-Stainless-Retry-Count": "1"}}, true},
		{"trace context", nil,
			call{header: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "a=1", "baggage": "x=1"}},
			call{header: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01", "tracestate": "a=2", "baggage": "x=2"}}, true},
		{"date, request id, user agent", nil,
			call{header: map[string]string{"Date": "Tue, 01 Dec 2026 09:00:00 GMT", "X-Request-Id": "r1", "User-Agent": "sdk/1 attempt/1"}},
			call{header: map[string]string{"Date": "Tue, 01 Dec 2026 09:00:01 GMT", "X-Request-Id": "r2", "User-Agent": "sdk/1 attempt/2"}}, true},
		{"a volatile header of the application's", []idem.Option{idem.WithVolatileHeaders("x-signature-nonce")},
			call{header: map[string]string{"X-Signature-Nonce": "n1"}}, call{header: map[string]string{"X-Signature-Nonce": "n2"}}, true},
		{"the same tenant", nil, call{header: map[string]string{"Stripe-Account": "acct_1"}}, call{header: map[string]string{"Stripe-Account": "acct_1"}}, true},
		{"Stripe-Account", nil, call{header: map[string]string{"Stripe-Account": "acct_1"}}, call{header: map[string]string{"Stripe-Account": "acct_2"}}, false},
		{"Stripe-Account only on one", nil, call{header: map[string]string{"Stripe-Account": "acct_1"}}, call{}, false},
		{"OpenAI-Organization", nil, call{header: map[string]string{"OpenAI-Organization": "org-1"}}, call{header: map[string]string{"OpenAI-Organization": "org-2"}}, false},
		{"OpenAI-Project", nil, call{header: map[string]string{"OpenAI-Project": "proj_1"}}, call{header: map[string]string{"OpenAI-Project": "proj_2"}}, false},
		{"any tenant header", nil, call{header: map[string]string{"X-Tenant-Id": "t1"}}, call{header: map[string]string{"X-Tenant-Id": "t2"}}, false},
		{"end users of one provider key, no principal function: one principal", nil,
			call{user: "alice"}, call{user: "bob"}, true},
		{"end users told apart by WithPrincipal", []idem.Option{idem.WithPrincipal(byUser)},
			call{user: "alice"}, call{user: "bob"}, false},
		{"one end user through WithPrincipal", []idem.Option{idem.WithPrincipal(byUser)},
			call{user: "alice"}, call{user: "alice"}, true},
		{"per-request JWTs without a principal function", nil,
			call{header: map[string]string{"Authorization": jwt("alice", 1)}}, call{header: map[string]string{"Authorization": jwt("alice", 2)}}, false},
		{"per-request JWTs matched through WithPrincipal", []idem.Option{idem.WithPrincipal(bySub)},
			call{header: map[string]string{"Authorization": jwt("alice", 1)}}, call{header: map[string]string{"Authorization": jwt("alice", 2)}}, true},
		{"per-request JWTs of two principals", []idem.Option{idem.WithPrincipal(bySub)},
			call{header: map[string]string{"Authorization": jwt("alice", 1)}}, call{header: map[string]string{"Authorization": jwt("bob", 2)}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt := &scriptRT{steps: []step{fail(errReset), resp(201)}}
				c, _ := newTestClient(rt, append([]idem.Option{idem.WithMaxAttempts(1)}, tt.opts...)...)
				defer c.Close()
				send := func(cl call) (*http.Response, error) {
					ctx := context.Background()
					if cl.user != "" {
						ctx = context.WithValue(ctx, userKey{}, cl.user)
					}
					req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://pay.example/v1/gift_cards", strings.NewReader(`{"amount":50}`))
					require.NoError(t, err)
					req.Header.Set("Content-Type", "application/json")
					for k, v := range cl.header {
						req.Header[k] = []string{v} // as spelled
					}
					return c.HTTPClient().Do(req)
				}
				_, err := send(tt.first)
				require.ErrorIs(t, err, idem.ErrAttemptsExhausted, "the first call is in doubt")
				r, err := send(tt.then)
				require.NoError(t, err)
				r.Body.Close()
				keys := rt.keys()
				require.Len(t, keys, 2)
				if tt.sameKey {
					assert.Equal(t, keys[0], keys[1], "a resend of the same call got a new key")
				} else {
					assert.NotEqual(t, keys[0], keys[1], "another call got the first one's key")
				}
			})
		})
	}
}

// TestWhoIsNotJoined pins what the README says resend matching does not
// do: a second identical call while the first is in flight (a double tap)
// and the same call through another process on the same journal (a retry
// on another replica) get keys of their own; only a name the application
// supplies joins them.
func TestWhoIsNotJoined(t *testing.T) {
	t.Run("double tap while in flight", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			release := make(chan struct{})
			var (
				mu   sync.Mutex
				keys []string
			)
			rt := roundTripFunc(func(r *http.Request) (*http.Response, error) {
				io.Copy(io.Discard, r.Body)
				mu.Lock()
				keys = append(keys, r.Header.Get("Idempotency-Key"))
				n := len(keys)
				mu.Unlock()
				if n == 1 {
					<-release
				}
				return &http.Response{StatusCode: 201, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
			})
			c, _ := newTestClient(rt)
			defer c.Close()
			done := make(chan struct{})
			go func() {
				defer close(done)
				r, err := post(t, context.Background(), c.HTTPClient(), `{"card":"gift"}`)
				if err == nil {
					r.Body.Close()
				}
			}()
			synctest.Wait() // the first tap is in flight
			r, err := post(t, context.Background(), c.HTTPClient(), `{"card":"gift"}`)
			require.NoError(t, err)
			r.Body.Close()
			close(release)
			<-done
			require.Len(t, keys, 2)
			assert.NotEqual(t, keys[0], keys[1], "matching joined a double tap")
		})
	})
	for _, named := range []bool{false, true} {
		t.Run(fmt.Sprintf("retry on another replica, named=%v", named), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt := &scriptRT{steps: []step{fail(errReset), resp(201)}}
				store := idem.NewMemoryStore()
				opts := []idem.Option{idem.WithBaseTransport(rt), idem.WithMaxAttempts(1)}
				a := idem.New(nopCloseStore{store}, append(opts, idem.WithOwner("a"))...)
				b := idem.New(nopCloseStore{store}, append(opts, idem.WithOwner("b"))...)
				defer a.Close()
				defer b.Close()
				ctx := context.Background()
				if named {
					ctx = idem.WithOperation(ctx, "order-42")
				}
				_, err := post(t, ctx, a.HTTPClient(), `{"amount":1}`)
				require.ErrorIs(t, err, idem.ErrAttemptsExhausted)
				r, err := post(t, ctx, b.HTTPClient(), `{"amount":1}`)
				require.NoError(t, err)
				r.Body.Close()
				keys := rt.keys()
				require.Len(t, keys, 2)
				if named {
					assert.Equal(t, keys[0], keys[1], "a name joins the retry on another replica")
				} else {
					assert.NotEqual(t, keys[0], keys[1], "matching reached another process")
				}
			})
		})
	}
}

// nopCloseStore lets two Clients share one MemoryStore, as replicas share
// a journal: closing a Client does not close the store.
type nopCloseStore struct{ *idem.MemoryStore }

func (nopCloseStore) Close() error { return nil }
