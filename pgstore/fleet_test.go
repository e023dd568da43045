package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemtest"
	"github.com/idemgo/idem/internal/chaoskit"
	"github.com/idemgo/idem/pgstore"
	"github.com/idemgo/idem/pgstore/internal/pgtest"
)

// Tests of the store under an idem.Client against a real PostgreSQL: what
// a fleet of replicas relies on.

const chargePath = "/v1/charges"

// charges is a provider's charge endpoint: it answers 201 with the order
// it was given and a fresh charge id. Wrapped in idemtest.NewServer, which
// counts its runs.
var charges = chaoskit.Orders

func orderBody(order string) string { return fmt.Sprintf(`{"order":%q,"amount":4200}`, order) }

// pay sends order's charge as the named operation "pay:<order>" and returns
// the status, or the error.
func pay(ctx context.Context, hc *http.Client, url, order string) (int, error) {
	req, err := http.NewRequestWithContext(idem.WithOperation(ctx, "pay:"+order), http.MethodPost, url+chargePath, strings.NewReader(orderBody(order)))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}

// quickRetries keeps retry waits short; Retry-After is capped to match.
var quickRetries = idem.WithRetryPolicy(idem.RetryPolicy{Initial: time.Millisecond, Max: 20 * time.Millisecond, RetryAfterCap: 20 * time.Millisecond})

// replica opens another Store on s's schema, as a second replica would.
func replica(t *testing.T, s *pgstore.Store) *pgstore.Store {
	t.Helper()
	r, err := pgstore.Open(testContext(t), pgtest.DSN(t), pgstore.WithSchema(s.Schema()))
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	return r
}

// keyOf returns the key the journal holds for an operation name.
func keyOf(t *testing.T, s *pgstore.Store, name string) string {
	t.Helper()
	var key string
	err := s.Pool().QueryRow(testContext(t), `SELECT key FROM `+pgx.Identifier{s.Schema(), "operations"}.Sanitize()+` WHERE name = $1`, name).Scan(&key)
	require.NoError(t, err, "key of %s", name)
	return key
}

// TestReservedBeforeSend checks, from the provider's side, that every keyed
// request arrives after its record is committed: the handler looks the key
// up through another replica's connection, which sees only committed rows.
func TestReservedBeforeSend(t *testing.T) {
	s := openStore(t)
	other := replica(t, s)
	var checked, missing atomic.Int64
	srv := idemtest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		rec, err := other.Get(r.Context(), key)
		if err != nil || rec.State != idem.StatePending || rec.Key != key {
			missing.Add(1)
			t.Errorf("request with key %q arrived before its record was committed: %+v, %v", key, rec, err)
		}
		checked.Add(1)
		charges(w, r)
	}))
	defer srv.Close()
	c := idem.New(s)
	defer c.Close()
	ctx := testContext(t)
	for i := range 5 {
		status, err := pay(ctx, c.HTTPClient(), srv.URL, fmt.Sprintf("order-%d", i))
		require.NoError(t, err)
		assert.Equal(t, http.StatusCreated, status)
	}
	// Unnamed operations get a fresh key each, reserved the same way.
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+chargePath, strings.NewReader(orderBody("unnamed")))
	require.NoError(t, err)
	resp, err := c.HTTPClient().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.EqualValues(t, 6, checked.Load(), "requests checked")
	assert.Zero(t, missing.Load())
}

// TestTwoReplicasOneName drives one named payment from two replicas at
// once, many calls each: one key goes on the wire, and the provider charges
// once.
func TestTwoReplicasOneName(t *testing.T) {
	a := openStore(t)
	b := replica(t, a)
	srv := idemtest.NewServer(http.HandlerFunc(charges), idemtest.WithRetryAfter(time.Millisecond))
	defer srv.Close()
	clients := []*idem.Client{idem.New(a, quickRetries), idem.New(b, quickRetries)}
	defer clients[0].Close()
	defer clients[1].Close()

	ctx := testContext(t)
	var wg sync.WaitGroup
	var ok, inFlight atomic.Int64
	start := make(chan struct{})
	for _, c := range clients {
		for range 8 {
			wg.Go(func() {
				<-start
				status, err := pay(ctx, c.HTTPClient(), srv.URL, "order-42")
				switch {
				case err == nil && status == http.StatusCreated:
					ok.Add(1)
				case errors.Is(err, idem.ErrInProgress):
					inFlight.Add(1) // the same name in flight in this replica
				default:
					t.Errorf("pay: %d, %v", status, err)
				}
			})
		}
	}
	close(start)
	wg.Wait()

	st := srv.Stats()
	key := keyOf(t, a, "pay:order-42")
	t.Logf("%d calls answered 201, %d refused as in flight; %d requests, %d replays, %d conflicts", ok.Load(), inFlight.Load(), st.Requests, st.Replays, st.Conflicts)
	assert.Positive(t, ok.Load(), "calls that got the charge")
	assert.Equal(t, 1, st.Runs, "charges")
	assert.Equal(t, map[string]int{key: st.Requests}, st.AttemptsByKey, "keys on the wire")
}

// TestResumeRespectsLeases resumes on one replica while another holds
// leases: a call in flight there, and a record leased to a replica that is
// still alive, are not sent; a record whose owner's lease lapsed is.
func TestResumeRespectsLeases(t *testing.T) {
	a := openStore(t)
	b := replica(t, a)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	srv := idemtest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get("X-Test"), "hold") {
			once.Do(func() { close(entered) })
			<-release
		}
		charges(w, r)
	}))
	defer srv.Close()
	ca, cb := idem.New(a, quickRetries), idem.New(b, quickRetries)
	defer ca.Close()
	defer cb.Close()
	ctx := testContext(t)

	// Replica A's call, held by the provider.
	inFlight := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(idem.WithOperation(ctx, "pay:held"), http.MethodPost, srv.URL+chargePath, strings.NewReader(orderBody("held")))
		req.Header.Set("X-Test", "hold")
		resp, err := ca.HTTPClient().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		inFlight <- err
	}()
	<-entered

	// Records of replicas that stopped answering: one whose lease is still
	// live, one whose lease lapsed a second ago.
	now := time.Now()
	record := func(order string, leaseUntil time.Time) idem.Operation {
		op := idem.Operation{
			Key: uuid.NewString(), KeyHeader: idem.DefaultHeader, Name: "pay:" + order, Method: http.MethodPost, URL: srv.URL + chargePath,
			State: idem.StatePending, Created: now.Add(-time.Minute), Owner: "replica-gone", LeaseUntil: leaseUntil,
			Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(orderBody(order)),
		}
		_, created, err := a.Reserve(ctx, op)
		require.NoError(t, err)
		require.True(t, created)
		return op
	}
	live := record("live", now.Add(time.Hour))
	lapsed := record("lapsed", now.Add(-time.Second))

	var resumed []string
	require.NoError(t, cb.Resume(ctx, func(op idem.Operation, resp *http.Response, err error) {
		if resp != nil {
			resp.Body.Close()
		}
		resumed = append(resumed, op.Name)
		assert.NoError(t, err, "resume of %s", op.Name)
	}))
	assert.Equal(t, []string{"pay:lapsed"}, resumed, "operations replica B resumed")

	st := srv.Stats()
	assert.Equal(t, 1, st.AttemptsByKey[lapsed.Key], "the lapsed operation is sent once")
	assert.Zero(t, st.AttemptsByKey[live.Key], "the live lease's operation is not sent")
	heldKey := keyOf(t, a, "pay:held")
	assert.Equal(t, 1, st.AttemptsByKey[heldKey], "the call in flight on replica A is not sent again")

	close(release)
	require.NoError(t, <-inFlight)
	for name, want := range map[string]idem.State{"pay:held": idem.StateSucceeded, "pay:lapsed": idem.StateSucceeded, "pay:live": idem.StatePending} {
		rec, err := b.Get(ctx, keyOf(t, a, name))
		require.NoError(t, err)
		assert.Equal(t, want, rec.State, name)
	}
}

// TestUnreachableFailsClosed takes PostgreSQL away (a proxy in between
// refuses connections and cuts the open ones): every payment fails with
// ErrJournalWrite, or, for one whose statement went out on a connection
// that was cut (the client cannot tell whether the server had it),
// ErrOutcomeUnknown with the key it may have; nothing reaches the
// provider. When PostgreSQL is back the payments go through.
func TestUnreachableFailsClosed(t *testing.T) {
	dsn := pgtest.DSN(t)
	p, viaProxy := newProxy(t, dsn)
	ctx := testContext(t)
	s, err := pgstore.Open(ctx, viaProxy, pgstore.WithSchema(pgtest.Schema(t, dsn)))
	require.NoError(t, err)
	srv := idemtest.NewServer(http.HandlerFunc(charges))
	defer srv.Close()
	c := idem.New(s, quickRetries)
	defer c.Close()

	status, err := pay(ctx, c.HTTPClient(), srv.URL, "before")
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)

	p.Down()
	for i := range 5 {
		_, err := pay(ctx, c.HTTPClient(), srv.URL, fmt.Sprintf("during-%d", i))
		require.Error(t, err)
		var ie *idem.Error
		require.ErrorAs(t, err, &ie)
		if errors.Is(err, idem.ErrOutcomeUnknown) {
			assert.NotEmpty(t, ie.Key, "an outcome-unknown error carries the key")
			assert.Equal(t, idem.StatePending, ie.State)
			assert.NotErrorIs(t, err, idem.ErrJournalWrite)
			continue
		}
		assert.ErrorIs(t, err, idem.ErrJournalWrite)
	}
	assert.Equal(t, 1, srv.Stats().Requests, "requests that reached the provider")

	p.Up()
	// The pool may hold connections cut while idle; each failed query
	// drops one, so the pool's size bounds the failures.
	var last error
	for try := 0; try < int(s.Pool().Config().MaxConns)+2; try++ {
		if _, last = pay(ctx, c.HTTPClient(), srv.URL, "after"); last == nil {
			break
		}
		if !errors.Is(last, idem.ErrOutcomeUnknown) {
			require.ErrorIs(t, last, idem.ErrJournalWrite)
		}
	}
	require.NoError(t, last, "payment after PostgreSQL came back")
	st := srv.Stats()
	assert.Equal(t, 2, st.Runs, "charges: before and after")
}

// TestTerminatedBackends kills the store's server processes with
// pg_terminate_backend (what a restart or failover does to them): calls fail
// closed until the pool has reconnected, then work.
func TestTerminatedBackends(t *testing.T) {
	dsn := pgtest.DSN(t)
	app := "idemtest-" + uuid.NewString()[:8]
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	ctx := testContext(t)
	s, err := pgstore.Open(ctx, dsn+sep+"application_name="+app, pgstore.WithSchema(pgtest.Schema(t, dsn)))
	require.NoError(t, err)
	defer s.Close()
	admin := replica(t, s)

	op := func(i int) idem.Operation {
		return idem.Operation{Key: fmt.Sprintf("k-%03d", i), Method: http.MethodPost, URL: "https://psp.example/v1", State: idem.StatePending}
	}
	var conns sync.WaitGroup
	for i := range 4 { // open several connections
		conns.Go(func() {
			_, _, err := s.Reserve(ctx, op(i))
			assert.NoError(t, err)
		})
	}
	conns.Wait()
	var killed int
	require.NoError(t, admin.Pool().QueryRow(ctx,
		`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&killed))
	require.Positive(t, killed, "backends terminated")

	failed := 0
	for i := 10; ; i++ {
		_, created, err := s.Reserve(ctx, op(i))
		if err == nil {
			require.True(t, created)
			break
		}
		require.ErrorIs(t, err, idem.ErrJournalWrite)
		_, gerr := admin.Get(ctx, op(i).Key)
		require.ErrorIs(t, gerr, idem.ErrNotFound, "a failed Reserve left a record")
		failed++
		require.LessOrEqual(t, failed, int(s.Pool().Config().MaxConns)+1, "the pool does not recover")
	}
	t.Logf("%d backends terminated, %d reservations failed closed before the pool recovered", killed, failed)
}

// TestCutMidTraffic cuts every connection to PostgreSQL several times while
// replicas pay orders, re-driving by name what failed. Afterwards every
// order is charged exactly once, under its journaled key, and nothing is
// left pending.
func TestCutMidTraffic(t *testing.T) {
	dsn := pgtest.DSN(t)
	p, viaProxy := newProxy(t, dsn)
	payThroughDisruptions(t, dsn, viaProxy, 60, 4, p.Cut)
}

// TestServerRestart restarts PostgreSQL itself while replicas pay orders
// (the restart starts halfway and runs beside the rest of them),
// with the command in IDEM_TEST_PG_RESTART (for example "pg_ctlcluster 15
// main restart", as root). A restart disturbs every session on the server,
// other test packages' too, so CI does not set it; TestCutMidTraffic and
// TestTerminatedBackends do the same to this test's connections only.
func TestServerRestart(t *testing.T) {
	dsn := pgtest.DSN(t)
	cmd := os.Getenv("IDEM_TEST_PG_RESTART")
	if cmd == "" {
		t.Skip("set IDEM_TEST_PG_RESTART to a command that restarts the test server to run this test")
	}
	// The restart runs while payments go on, and the test waits for it.
	var restart sync.WaitGroup
	defer restart.Wait()
	payThroughDisruptions(t, dsn, dsn, 400, 1, func() {
		restart.Go(func() {
			if out, err := exec.Command("sh", "-c", cmd).CombinedOutput(); err != nil {
				t.Errorf("restart: %v: %s", err, out)
			}
		})
	})
}

// payThroughDisruptions has two replicas on the journal at storeDSN pay
// orders orders, disrupting PostgreSQL as the charges run, disruptions times in
// all. Every payment that fails is re-driven by name;
// one that failed because the journal was away is re-driven until it is
// back. Then both replicas close (writing the marks PostgreSQL refused),
// and a third one, on dsn, finds nothing to resume.
func payThroughDisruptions(t *testing.T, dsn, storeDSN string, orders, disruptions int, disrupt func()) {
	ctx := testContext(t)
	schema := pgtest.Schema(t, dsn)
	const workers = 6
	var runs atomic.Int64
	srv := idemtest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n, every := runs.Add(1), int64(orders/(disruptions+1)); n%every == 0 && n/every <= int64(disruptions) {
			disrupt() // as the charge runs, holding its answer: its mark meets a dead connection, other calls a dead server
		}
		charges(w, r)
	}))
	defer srv.Close()

	var clients []*idem.Client
	for range 2 {
		s, err := pgstore.Open(ctx, storeDSN, pgstore.WithSchema(schema))
		require.NoError(t, err)
		clients = append(clients, idem.New(s, quickRetries))
	}
	jobs := make(chan int)
	var failures, journalErrs atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		c := clients[w%len(clients)]
		wg.Go(func() {
			for i := range jobs {
				for try := 0; ; {
					status, err := pay(ctx, c.HTTPClient(), srv.URL, fmt.Sprintf("order-%d", i))
					if err == nil && status == http.StatusCreated {
						break
					}
					failures.Add(1)
					if errors.Is(err, idem.ErrJournalWrite) && ctx.Err() == nil {
						journalErrs.Add(1)
						time.Sleep(10 * time.Millisecond) // the journal is away: nothing was sent; wait for it
						continue
					}
					if try++; try == 20 {
						t.Errorf("order-%d: still failing: %d, %v", i, status, err)
						break
					}
				}
			}
		})
	}
	for i := range orders {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	// The replicas shut down: Close writes the marks a cut connection
	// refused (they were accepted, and are written again until taken).
	for _, c := range clients {
		require.NoError(t, c.Close())
	}

	// A replica that comes up afterwards finds nothing to do.
	s, err := pgstore.Open(ctx, dsn, pgstore.WithSchema(schema))
	require.NoError(t, err)
	final := idem.New(s, quickRetries)
	defer final.Close()
	resumed := 0
	require.NoError(t, final.Resume(ctx, func(op idem.Operation, resp *http.Response, err error) {
		if resp != nil {
			resp.Body.Close()
		}
		resumed++
	}))
	pending, err := s.Pending(ctx, "", 0)
	require.NoError(t, err)

	st := srv.Stats()
	t.Logf("%d failed calls re-driven (%d journal errors), %d resumed afterwards; %d requests, %d charges, %d replays",
		failures.Load(), journalErrs.Load(), resumed, st.Requests, st.Runs, st.Replays)
	assert.Empty(t, names(pending), "operations left pending")
	assert.Equal(t, orders, st.Runs, "charges")
	journaled := map[string]bool{}
	for i := range orders {
		order := fmt.Sprintf("order-%d", i)
		key := keyOf(t, s, "pay:"+order)
		journaled[key] = true
		assert.Equal(t, 1, st.RunsByPayload[idemtest.Fingerprint(http.MethodPost, chargePath, []byte(orderBody(order)))], "charges of %s", order)
		rec, err := s.Get(ctx, key)
		require.NoError(t, err)
		assert.Equal(t, idem.StateSucceeded, rec.State, order)
	}
	for k := range st.AttemptsByKey {
		assert.True(t, journaled[k], "key %s on the wire is not in the journal", k)
	}
}

// names returns the names of ops, for messages.
func names(ops []idem.Operation) []string {
	var ns []string
	for _, op := range ops {
		ns = append(ns, op.Name)
	}
	return ns
}
