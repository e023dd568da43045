package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemserver"
	"github.com/idemgo/idem/idemserver/storetest"
	"github.com/idemgo/idem/pgstore"
	"github.com/idemgo/idem/pgstore/internal/pgtest"
)

// openServerStore opens a ServerStore on schema, closed when t ends.
func openServerStore(t *testing.T, dsn, schema string) *pgstore.ServerStore {
	t.Helper()
	s, err := pgstore.OpenServerStore(testContext(t), dsn, pgstore.WithSchema(schema))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// TestServerStoreConformance runs idemserver's Store suite, each subtest
// on a schema of its own.
func TestServerStoreConformance(t *testing.T) {
	dsn := pgtest.DSN(t)
	storetest.Run(t, storetest.Config{Open: func(t *testing.T) idemserver.Store {
		s, err := pgstore.OpenServerStore(testContext(t), dsn, pgstore.WithSchema(pgtest.Schema(t, dsn)))
		require.NoError(t, err)
		pgstore.SetCallerClock(s) // the suite moves time by the times it passes
		return s                  // Run closes it
	}})
}

// TestServerStoreExactTimes checks that times keep their nanoseconds.
func TestServerStoreExactTimes(t *testing.T) {
	dsn := pgtest.DSN(t)
	s := openServerStore(t, dsn, pgtest.Schema(t, dsn))
	pgstore.SetCallerClock(s)
	ctx := testContext(t)
	now := time.Date(2026, 11, 29, 12, 0, 0, 123456789, time.UTC)
	until := now.Add(30*time.Second + 987*time.Nanosecond)
	c, err := s.Begin(ctx, idemserver.Begin{ID: "k", Fingerprint: "f", Now: now, LeaseUntil: until})
	require.NoError(t, err)
	require.Equal(t, idemserver.StateAcquired, c.State)

	c, err = s.Begin(ctx, idemserver.Begin{ID: "k", Fingerprint: "f", Now: until.Add(-time.Nanosecond), LeaseUntil: until.Add(time.Minute)})
	require.NoError(t, err)
	assert.Equal(t, idemserver.StateInFlight, c.State, "one nanosecond before the lease ends")
	assert.True(t, c.LeaseUntil.Equal(until), "LeaseUntil %v, want %v", c.LeaseUntil, until)

	c, err = s.Begin(ctx, idemserver.Begin{ID: "k", Fingerprint: "f", Now: until, LeaseUntil: until.Add(time.Minute)})
	require.NoError(t, err)
	assert.Equal(t, idemserver.StateAcquired, c.State, "at the lease's end")
}

// TestServerStoreTakeoverAcrossReplicas lets requests on two replicas take
// over one lapsed key at once: exactly one acquires it, every other sees
// it in flight under the winner's lease.
func TestServerStoreTakeoverAcrossReplicas(t *testing.T) {
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	stores := []*pgstore.ServerStore{openServerStore(t, dsn, schema), openServerStore(t, dsn, schema)}
	for _, s := range stores {
		pgstore.SetCallerClock(s)
	}
	ctx := testContext(t)
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for round := range 20 {
		id := fmt.Sprintf("k%d", round)
		c, err := stores[0].Begin(ctx, idemserver.Begin{ID: id, Fingerprint: "f", Now: t0, LeaseUntil: t0.Add(time.Second)})
		require.NoError(t, err)
		require.Equal(t, idemserver.StateAcquired, c.State)

		const n = 16
		later := t0.Add(time.Minute)
		claims := make([]idemserver.Claim, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				claims[i], errs[i] = stores[i%2].Begin(ctx, idemserver.Begin{ID: id, Fingerprint: "f", Now: later, LeaseUntil: later.Add(time.Minute)})
			})
		}
		wg.Wait()
		acquired := 0
		for i := range n {
			require.NoError(t, errs[i])
			switch claims[i].State {
			case idemserver.StateAcquired:
				acquired++
			case idemserver.StateInFlight:
				assert.True(t, claims[i].LeaseUntil.Equal(later.Add(time.Minute)), "round %d: in flight until %v, want the new holder's", round, claims[i].LeaseUntil)
			default:
				t.Errorf("round %d: state %v", round, claims[i].State)
			}
		}
		require.Equal(t, 1, acquired, "round %d: Begins that took the lapsed key over", round)
	}
}

// TestConcurrentOpenBothStores starts client and server stores on one
// fresh schema at once: the migrations run once and every store opens.
func TestConcurrentOpenBothStores(t *testing.T) {
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	ctx := testContext(t)
	const replicas = 6
	closers := make([]func() error, replicas)
	errs := make([]error, replicas)
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Go(func() {
			if i%2 == 0 {
				var s *pgstore.Store
				if s, errs[i] = pgstore.Open(ctx, dsn, pgstore.WithSchema(schema)); s != nil {
					closers[i] = s.Close
				}
				return
			}
			var s *pgstore.ServerStore
			if s, errs[i] = pgstore.OpenServerStore(ctx, dsn, pgstore.WithSchema(schema)); s != nil {
				closers[i] = s.Close
			}
		})
	}
	wg.Wait()
	for i := range replicas {
		require.NoError(t, errs[i], "replica %d", i)
		defer closers[i]()
	}
	s := openServerStore(t, dsn, schema)
	assert.Equal(t, allMigrations, migrationVersions(t, ctx, s.Pool(), schema), "every migration applied once")
}

// replicas is a fleet of two: two middlewares, each on a ServerStore of
// its own over one schema, in front of one handler that counts its runs.
// The handler answers 201 with the run's number; while block is set, the
// first run waits for release.
type replicas struct {
	a, b    http.Handler
	runs    atomic.Int32
	block   bool
	release chan struct{}
}

func newReplicas(t *testing.T, block bool) *replicas {
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	f := &replicas{block: block, release: make(chan struct{})}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := f.runs.Add(1)
		if f.block && n == 1 {
			<-f.release
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/1")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"run":%d}`, n)
	})
	f.a = idemserver.New(openServerStore(t, dsn, schema), idemserver.WithSingleTenant()).Required(h)
	f.b = idemserver.New(openServerStore(t, dsn, schema), idemserver.WithSingleTenant()).Required(h)
	return f
}

func postKey(t *testing.T, h http.Handler, key, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequestWithContext(testContext(t), http.MethodPost, "/orders", strings.NewReader(body))
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestReplicaRetryIsReplayed sends a request to replica A and its retry to
// replica B: the handler runs once and B replays A's answer.
func TestReplicaRetryIsReplayed(t *testing.T) {
	f := newReplicas(t, false)
	first := postKey(t, f.a, "order-1", `{"sku":"x"}`)
	require.Equal(t, http.StatusCreated, first.Code, first.Body.String())
	assert.Empty(t, first.Header().Get(idemserver.ReplayedHeader))

	retry := postKey(t, f.b, "order-1", `{"sku":"x"}`)
	assert.Equal(t, http.StatusCreated, retry.Code)
	assert.Equal(t, "true", retry.Header().Get(idemserver.ReplayedHeader))
	assert.Equal(t, `{"run":1}`, retry.Body.String())
	assert.Equal(t, "/orders/1", retry.Header().Get("Location"))
	assert.Equal(t, int32(1), f.runs.Load(), "handler runs")

	other := postKey(t, f.b, "order-1", `{"sku":"y"}`)
	assert.Equal(t, http.StatusUnprocessableEntity, other.Code, "the key with another payload, on B")
	assert.Equal(t, int32(1), f.runs.Load(), "handler runs")
}

// TestReplicasConcurrentSameKey sends one key to both replicas at once:
// one runs the handler, the other answers 409 while it runs.
func TestReplicasConcurrentSameKey(t *testing.T) {
	f := newReplicas(t, true)
	results := make(chan *httptest.ResponseRecorder, 2)
	for _, h := range []http.Handler{f.a, f.b} {
		go func() { results <- postKey(t, h, "order-2", `{"sku":"x"}`) }()
	}
	// The first run waits for release, so the first answer is the loser's
	// (if both ran, the second run would not wait and answer 201).
	first := <-results
	close(f.release)
	second := <-results
	assert.Equal(t, http.StatusConflict, first.Code, "first answer: %s", first.Body.String())
	assert.NotEmpty(t, first.Header().Get("Retry-After"))
	assert.Equal(t, http.StatusCreated, second.Code, "second answer: %s", second.Body.String())
	assert.Equal(t, int32(1), f.runs.Load(), "handler runs")
}

// TestServerStoreUnreachable cuts PostgreSQL away from a running store:
// the middleware answers 503 and does not run the handler.
func TestServerStoreUnreachable(t *testing.T) {
	dsn := pgtest.DSN(t)
	p, viaProxy := newProxy(t, dsn)
	s := openServerStore(t, viaProxy, pgtest.Schema(t, dsn))
	var runs atomic.Int32
	h := idemserver.New(s, idemserver.WithSingleTenant()).Required(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	require.Equal(t, http.StatusCreated, postKey(t, h, "before", "x").Code, "while PostgreSQL is up")

	p.Down()
	w := postKey(t, h, "during", "x")
	assert.Equal(t, http.StatusServiceUnavailable, w.Code, w.Body.String())
	assert.Equal(t, int32(1), runs.Load(), "handler runs: only the request before the outage")

	now := time.Now()
	_, err := s.Begin(testContext(t), idemserver.Begin{ID: "direct", Fingerprint: "f", Now: now, LeaseUntil: now.Add(time.Minute)})
	assert.ErrorIs(t, err, idem.ErrJournalWrite)
}

// TestOpenServerStoreUnreachable needs no server: nothing listens on the
// port.
func TestOpenServerStoreUnreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err := pgstore.OpenServerStore(ctx, "postgres://idem@127.0.0.1:1/none?connect_timeout=5")
	require.Error(t, err)
	assert.True(t, errors.Is(err, idem.ErrJournalWrite), "got %v", err)
}

// ExampleOpenServerStore makes a route idempotent for the whole fleet:
// every replica opens the same database, and a retry of a POST that lands
// on another replica than the first attempt gets the stored answer.
func ExampleOpenServerStore() {
	ctx := context.Background()
	keys, err := pgstore.OpenServerStore(ctx, "postgres://idem@db:5432/shop?connect_timeout=5")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer keys.Close()
	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})
	// A key belongs to the account the application's authentication put
	// in the request's context (see accountOf).
	mw := idemserver.New(keys, idemserver.WithPrincipal(accountOf))
	mux := http.NewServeMux()
	mux.Handle("POST /orders", authenticate(mw.Required(createOrder)))
	_ = http.ListenAndServe(":8080", mux)
}

// accountKey is the context key of the account authenticate found.
type accountKey struct{}

// authenticate stands for the application's authentication: it puts the
// account a bearer token names in the request's context, or answers 401.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || token == "" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), accountKey{}, "acct_for_"+token)))
	})
}

// accountOf is the middleware's principal function: the account in the
// request's context.
func accountOf(r *http.Request) (string, error) {
	if acct, ok := r.Context().Value(accountKey{}).(string); ok {
		return acct, nil
	}
	return "", idemserver.ErrNoCredentials
}

// TestBeginEndedReleaseFails ends a claim's context while PostgreSQL
// stalls (a proxy holds every byte), so that the claim's statement was
// sent and its release cannot be: Begin's error must not say the key is
// released (it said so whatever the release did), and says that the
// release failed.
func TestBeginEndedReleaseFails(t *testing.T) {
	dsn := pgtest.DSN(t)
	p, viaProxy := newProxy(t, dsn)
	s := openServerStore(t, viaProxy, pgtest.Schema(t, dsn))
	now := time.Now()
	_, err := s.Begin(testContext(t), idemserver.Begin{ID: "before", Fingerprint: "f", Now: now, LeaseUntil: now.Add(time.Minute)})
	require.NoError(t, err, "while PostgreSQL answers")

	p.Stall()
	defer p.Flow()
	ctx, cancel := context.WithTimeout(testContext(t), 100*time.Millisecond)
	defer cancel()
	_, err = s.Begin(ctx, idemserver.Begin{ID: "stalled", Fingerprint: "f", Now: now, LeaseUntil: now.Add(time.Minute)})
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "its key is released")
	assert.Contains(t, err.Error(), "releasing its key failed")
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}
