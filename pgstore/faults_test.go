package pgstore_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemtest"
	"github.com/idemgo/idem/pgstore"
	"github.com/idemgo/idem/pgstore/internal/pgtest"
	"github.com/idemgo/idem/storetest"
)

// Tests of the store with a faulty network between it and PostgreSQL:
// replies swallowed after a commit, a black hole, rejected marks.

// viaProxy opens a Store on a fresh schema through a proxy, and a second
// Store on the same schema straight to PostgreSQL, to look at the truth.
func viaProxy(t *testing.T, opts ...pgstore.Option) (*proxy, *pgstore.Store, *pgstore.Store) {
	t.Helper()
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	p, through := newProxy(t, dsn)
	s, err := pgstore.Open(testContext(t), through, append([]pgstore.Option{pgstore.WithSchema(schema)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	direct, err := pgstore.Open(testContext(t), dsn, pgstore.WithSchema(schema))
	require.NoError(t, err)
	t.Cleanup(func() { direct.Close() })
	return p, s, direct
}

// chargedOnce asserts that the journal PostgreSQL holds records key as
// succeeded and that srv ran its handler once; msgAndArgs go with the
// state's assertion.
func chargedOnce(t *testing.T, ctx context.Context, direct *pgstore.Store, srv *idemtest.Server, key string, msgAndArgs ...any) {
	t.Helper()
	rec, err := direct.Get(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, rec.State, msgAndArgs...)
	assert.Equal(t, 1, srv.Stats().Runs, "charges")
}

// lostReservation swallows PostgreSQL's answer to the statement whose
// parameters hold pattern, runs call under a 2-second deadline, and
// returns the error it failed with (it must match idem.ErrOutcomeUnknown)
// and the *idem.Error in it.
func lostReservation(t *testing.T, ctx context.Context, p *proxy, pattern string, call func(context.Context) error) (*idem.Error, error) {
	t.Helper()
	p.SwallowAfter(pattern)
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	err := call(dctx)
	cancel()
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	var ie *idem.Error
	require.ErrorAs(t, err, &ie)
	return ie, err
}

// TestReserveOutcomeUnknown loses the answer to a reservation that
// PostgreSQL committed: the caller is told the outcome is unknown, with
// the key the journal now holds, never "not journaled"; the row is there;
// a re-drive of the name finds it, and the provider is charged once.
func TestReserveOutcomeUnknown(t *testing.T) {
	p, s, direct := viaProxy(t)
	srv := idemtest.NewServer(http.HandlerFunc(charges))
	defer srv.Close()
	c := idem.New(s, quickRetries)
	defer c.Close()
	ctx := testContext(t)

	// "pay:o1": the reservation's parameters, after its statement was prepared.
	ie, err := lostReservation(t, ctx, p, "pay:o1", func(ctx context.Context) error {
		_, err := pay(ctx, c.HTTPClient(), srv.URL, "o1")
		return err
	})
	assert.NotErrorIs(t, err, idem.ErrJournalWrite, "an outcome-unknown reservation is not reported as not journaled")
	assert.Equal(t, idem.StatePending, ie.State)
	require.NotEmpty(t, ie.Key, "the error carries the key that may be journaled")
	assert.Equal(t, keyOf(t, direct, "pay:o1"), ie.Key, "the row PostgreSQL committed has the error's key")
	assert.Zero(t, srv.Stats().Requests, "nothing sent by the failed call")

	// The name's next call finds the row and sends it under its key.
	var status int
	for try := 0; try < 8; try++ { // connections cut while swallowed fail once each
		if status, err = pay(ctx, c.HTTPClient(), srv.URL, "o1"); err == nil {
			break
		}
	}
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, status)
	chargedOnce(t, ctx, direct, srv, ie.Key)
}

// TestReserveOutcomeUnknownResumed leaves an outcome-unknown reservation
// to the replica's own Resume: it finishes it as an operation in doubt,
// under the key the caller was given.
func TestReserveOutcomeUnknownResumed(t *testing.T) {
	p, s, direct := viaProxy(t)
	srv := idemtest.NewServer(http.HandlerFunc(charges))
	defer srv.Close()
	c := idem.New(s, quickRetries)
	defer c.Close()
	ctx := testContext(t)

	ie, err := lostReservation(t, ctx, p, "pay:o2", func(ctx context.Context) error {
		_, err := pay(ctx, c.HTTPClient(), srv.URL, "o2")
		return err
	})

	var resumed []string
	for try := 0; try < 8 && len(resumed) == 0; try++ {
		err = c.Resume(ctx, func(op idem.Operation, resp *http.Response, err error) {
			if resp != nil {
				resp.Body.Close()
			}
			if err == nil {
				resumed = append(resumed, op.Key)
			}
		})
	}
	require.NoError(t, err)
	assert.Equal(t, []string{ie.Key}, resumed, "Resume sends the in-doubt reservation under the caller's key")
	chargedOnce(t, ctx, direct, srv, ie.Key)
}

// TestReserveRetriedAfterCut cuts the connection of a reservation after
// PostgreSQL committed it: the store tries again on a fresh connection,
// finds its own row and reports it created, so the call goes through.
func TestReserveRetriedAfterCut(t *testing.T) {
	p, s, direct := viaProxy(t)
	ctx := testContext(t)
	p.SwallowAfter("cut-1")
	op := storetest.NewOperation("cut-1")
	done := make(chan error, 1)
	go func() {
		_, created, err := s.Reserve(ctx, op)
		if err == nil && !created {
			err = errors.New("reported not created")
		}
		done <- err
	}()
	require.Eventually(t, func() bool { _, err := direct.Get(ctx, op.Key); return err == nil }, time.Minute, 10*time.Millisecond)
	p.Cut()
	require.NoError(t, <-done, "the retried reservation finds its own row")
}

// TestStalledReservationKeepsDeadline black-holes PostgreSQL: a
// reservation with a 2 s deadline returns with its context's error (and
// outcome unknown, since its statement may have gone out), and Close
// returns although the database never answers.
func TestStalledReservationKeepsDeadline(t *testing.T) {
	p, s, _ := viaProxy(t)
	srv := idemtest.NewServer(http.HandlerFunc(charges))
	defer srv.Close()
	c := idem.New(s, quickRetries)
	ctx := testContext(t)
	status, err := pay(ctx, c.HTTPClient(), srv.URL, "before")
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)

	p.Stall()
	// The caller's own cause tells its deadline from any bound of the
	// store's: the call returns when the caller's deadline passes.
	errCallerDeadline := errors.New("the caller's 2 s deadline")
	dctx, cancel := context.WithTimeoutCause(ctx, 2*time.Second, errCallerDeadline)
	_, err = pay(dctx, c.HTTPClient(), srv.URL, "stalled")
	cancel()
	require.Error(t, err)
	assert.ErrorIs(t, err, errCallerDeadline)
	assert.True(t, errors.Is(err, idem.ErrOutcomeUnknown) || errors.Is(err, idem.ErrJournalWrite), "got %v", err)
	assert.Zero(t, srv.Stats().Requests-1, "nothing sent while stalled")

	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case <-closed: // an error is expected: the database took nothing
	case <-ctx.Done():
		t.Fatal("Close did not return while PostgreSQL stalls")
	}
	p.Flow()
}

// TestBadTextMarks writes marks whose error text PostgreSQL refuses
// (invalid UTF-8, a NUL byte), as no journal passes (it cleans and bounds
// error text for every store): each is written without its text, and the
// store goes on working.
func TestBadTextMarks(t *testing.T) {
	s := openStore(t)
	ctx := testContext(t)
	for _, k := range []string{"k1", "k2"} {
		_, _, err := s.Reserve(ctx, storetest.NewOperation(k))
		require.NoError(t, err)
	}
	bad := "proxy said \xff\xfe\x00 Bad Gateway " + strings.Repeat("é", 10000)
	require.NoError(t, s.Attempt(ctx, "k1", idem.Attempt{Sent: 1, Err: bad, At: time.Now()}))
	require.NoError(t, s.Finish(ctx, "k2", idem.Outcome{State: idem.StateFailed, Err: bad, At: time.Now()}))
	for _, k := range []string{"k1", "k2"} {
		rec, err := s.Get(ctx, k)
		require.NoError(t, err, "a call after a bad mark")
		assert.Contains(t, rec.LastError, "error text refused by PostgreSQL", k)
	}
	rec, err := s.Get(ctx, "k2")
	require.NoError(t, err)
	assert.Equal(t, idem.StateFailed, rec.State, "the finish, written without its text")
}

// TestRefusedMarkDropped makes PostgreSQL refuse marks for their content
// (check constraints the test adds): a mark refused for its text is
// written without it, one refused for anything else is dropped and
// reported; neither blocks the calls after it.
func TestRefusedMarkDropped(t *testing.T) {
	s := openStore(t)
	ctx := testContext(t)
	ops := pgx.Identifier{s.Schema(), "operations"}.Sanitize()
	_, err := s.Pool().Exec(ctx, `ALTER TABLE `+ops+` ADD CONSTRAINT no_poison CHECK (last_error <> 'poison'),
		ADD CONSTRAINT no_599 CHECK (last_status <> 599)`)
	require.NoError(t, err)
	for _, k := range []string{"k1", "k2", "k3"} {
		_, _, err := s.Reserve(ctx, storetest.NewOperation(k))
		require.NoError(t, err)
	}
	require.NoError(t, s.Attempt(ctx, "k1", idem.Attempt{Sent: 1, Status: 503, Err: "poison", At: time.Now()}))
	err = s.Finish(ctx, "k2", idem.Outcome{State: idem.StateFailed, Status: 599, At: time.Now()})
	assert.ErrorIs(t, err, idem.ErrJournalWrite, "a mark refused for good is reported")
	require.NoError(t, s.Finish(ctx, "k3", idem.Outcome{State: idem.StateSucceeded, Status: 201, Sent: 1, At: time.Now()}))

	rec, err := s.Get(ctx, "k1")
	require.NoError(t, err)
	assert.Equal(t, 1, rec.Attempts, "k1's attempt, written without its text")
	assert.Contains(t, rec.LastError, "SQLSTATE 23514")
	rec, err = s.Get(ctx, "k2")
	require.NoError(t, err)
	assert.Equal(t, idem.StatePending, rec.State, "k2's refused finish was dropped: Resume sends it again")
	rec, err = s.Get(ctx, "k3")
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, rec.State, "the mark after the refused ones")
}

// TestUnnamedOutcomeUnknownResend loses the answer to an unnamed call's
// reservation: the caller's resend of the same payload joins the key the
// error carried (resend matching), so the provider is charged once.
func TestUnnamedOutcomeUnknownResend(t *testing.T) {
	p, s, direct := viaProxy(t)
	srv := idemtest.NewServer(http.HandlerFunc(charges))
	defer srv.Close()
	c := idem.New(s, quickRetries)
	defer c.Close()
	ctx := testContext(t)
	send := func(ctx context.Context) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+chargePath, strings.NewReader(orderBody("u1")))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		return c.HTTPClient().Do(req)
	}

	ie, _ := lostReservation(t, ctx, p, `"order":"u1"`, func(ctx context.Context) error {
		_, err := send(ctx)
		return err
	})
	require.NotEmpty(t, ie.Key)

	var resp *http.Response
	var err error
	for try := 0; try < 8; try++ {
		if resp, err = send(ctx); err == nil {
			break
		}
	}
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	chargedOnce(t, ctx, direct, srv, ie.Key, "the resend used the key the error carried")
}

// TestStalledFinishKeepsAnswer black-holes PostgreSQL while the provider
// answers: the caller still reads its 201 to the end (Finish waits for its
// commit only a bounded time, then holds the mark), and once PostgreSQL
// answers again the held mark is written.
func TestStalledFinishKeepsAnswer(t *testing.T) {
	p, s, direct := viaProxy(t)
	entered, release := make(chan struct{}), make(chan struct{})
	srv := idemtest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		charges(w, r)
	}))
	defer srv.Close()
	c := idem.New(s, quickRetries)
	defer c.Close()
	ctx := testContext(t)

	paid := make(chan error, 1)
	go func() {
		status, err := pay(ctx, c.HTTPClient(), srv.URL, "slow")
		if err == nil && status != http.StatusCreated {
			err = errors.New(http.StatusText(status))
		}
		paid <- err
	}()
	<-entered
	key := keyOf(t, direct, "pay:slow")
	p.Stall()
	close(release)
	select {
	case err := <-paid:
		require.NoError(t, err, "the answer read to its end while PostgreSQL stalls")
	case <-ctx.Done():
		t.Fatal("reading the answer waited for PostgreSQL")
	}
	p.Flow()
	require.Eventually(t, func() bool {
		rec, err := direct.Get(ctx, key)
		return err == nil && rec.State == idem.StateSucceeded
	}, time.Minute, 20*time.Millisecond, "the held finish mark is written once PostgreSQL answers")
}
