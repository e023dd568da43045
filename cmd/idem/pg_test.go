package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/pgstore"
)

// Tests of the real idem binary on a shared PostgreSQL journal written by
// an idem Client with pgstore. They need IDEM_TEST_POSTGRES (as pgstore's
// tests do: pgstore/internal/pgtest, which this module cannot import):
// without it they skip with a one-line reason, and with CI=true they fail.

const envDSN = "IDEM_TEST_POSTGRES"

// pgJournalSchema returns the test server's URL and a new schema name for
// t, dropped with everything in it when t ends.
func pgJournalSchema(t *testing.T) (dsn, schema string) {
	t.Helper()
	dsn = os.Getenv(envDSN)
	if dsn == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set and CI=true: the PostgreSQL tests are required in CI (.ci/run starts a server)", envDSN)
		}
		t.Skipf("no PostgreSQL: set %s=postgres://... to run this test", envDSN)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema = "idemcmd_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return dsn, schema
}

// sharedIdem builds the idem command and returns it with a function
// that runs it on the shared journal in schema.
func sharedIdem(t *testing.T, dsn, schema string) (string, func(args ...string) (int, string, string)) {
	t.Helper()
	bin := buildIdem(t, t.TempDir())
	return bin, func(args ...string) (int, string, string) {
		return runBin(t, bin, append([]string{"--journal", dsn, "--schema", schema}, args...)...)
	}
}

// lookAt opens a store of its own on the shared journal, for the test to
// read what the command did.
func lookAt(t *testing.T, dsn, schema string) *pgstore.Store {
	t.Helper()
	s, err := pgstore.Open(context.Background(), dsn, pgstore.WithSchema(schema))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// replica is an application's replica on the shared journal; closing its
// Client closes its store.
type replica struct {
	store *pgstore.Store
	c     *idem.Client
}

func newReplica(t *testing.T, dsn, schema string, opts ...idem.Option) replica {
	t.Helper()
	store, err := pgstore.Open(context.Background(), dsn, pgstore.WithSchema(schema))
	require.NoError(t, err)
	opts = append([]idem.Option{
		idem.WithMaxAttempts(2),
		idem.WithBackoff(time.Millisecond, time.Millisecond),
		idem.WithBaseTransport(&http.Transport{DisableKeepAlives: true}),
	}, opts...)
	return replica{store, idem.New(store, opts...)}
}

// pay sends a named payment to url and returns its key.
func (r replica) pay(t *testing.T, name, url string) string {
	t.Helper()
	return r.payWith(t, name, url, "")
}

// payWith is pay with an Authorization header (never journaled) if auth
// is not "".
func (r replica) payWith(t *testing.T, name, url, auth string) string {
	t.Helper()
	ctx := idem.WithOperation(context.Background(), name)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"amount":4200}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := r.c.HTTPClient().Do(req)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	op, err := r.store.Named(context.Background(), name)
	require.NoError(t, err)
	return op.Key
}

// waitLapsed waits, a bounded number of times, until the lease on key has
// lapsed by the local clock (the replica's lease is short).
func waitLapsed(t *testing.T, store *pgstore.Store, key string) {
	t.Helper()
	for range 100 {
		op, err := store.Get(context.Background(), key)
		require.NoError(t, err)
		if !op.LeaseUntil.After(time.Now()) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the lease on %s never lapsed", key)
}

// leasedByLiveReplica journals a pending operation that replica "replica-b",
// still running, holds for ten more minutes.
func leasedByLiveReplica(t *testing.T, store *pgstore.Store, url, header string) string {
	t.Helper()
	now := time.Now()
	key := uuid.Must(uuid.NewV7()).String()
	_, created, err := store.Reserve(context.Background(), idem.Operation{
		Key: key, KeyHeader: header, Name: "pay:leased", Method: http.MethodPost, URL: url, State: idem.StatePending,
		Created: now, Updated: now, Attempts: 1, Fingerprint: [32]byte{7},
		Owner: "replica-b", LeaseUntil: now.Add(10 * time.Minute),
		Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"amount":1}`),
	})
	require.NoError(t, err)
	require.True(t, created)
	return key
}

// keepsPolicy reports whether pgstore keeps the application's policy:
// resume and gc act only then.
func keepsPolicy() bool {
	_, ok := any((*pgstore.Store)(nil)).(idem.PolicyStore)
	return ok
}

// TestSharedJournalIsListed: ls, pending, show and stats read a PostgreSQL
// journal a replica wrote; verify says it checks bbolt files only; the
// URL's password is never printed; a schema without a journal is refused,
// not created; expire takes an operation whose replica died.
func TestSharedJournalIsListed(t *testing.T) {
	dsn, schema := pgJournalSchema(t)
	p := newRecorder(t)
	app := newReplica(t, dsn, schema, idem.WithOwner("replica-a"), idem.WithLease(100*time.Millisecond))
	okKey := app.pay(t, "pay:ok", p.URL+"/ok")
	lostKey := app.pay(t, "pay:lost", p.URL+"/lost")
	require.NoError(t, app.c.Close())
	look := lookAt(t, dsn, schema)
	bin, idemOn := sharedIdem(t, dsn, schema)
	decode := func(v any, args ...string) {
		t.Helper()
		code, out, errOut := idemOn(append([]string{"--json"}, args...)...)
		require.Equal(t, exitOK, code, errOut)
		require.NoError(t, json.Unmarshal([]byte(out), v), out)
	}
	var printed strings.Builder

	var all listing
	decode(&all, "ls")
	states := map[string]string{}
	for _, v := range all.Operations {
		states[v.Name] = v.State
	}
	assert.Equal(t, map[string]string{"pay:ok": "succeeded", "pay:lost": "pending"}, states)

	var pend listing
	decode(&pend, "pending")
	require.Len(t, pend.Operations, 1)
	assert.Equal(t, lostKey, pend.Operations[0].Key)
	assert.Equal(t, "replica-a", pend.Operations[0].Owner)

	code, out, errOut := idemOn("show", "pay:ok")
	printed.WriteString(out + errOut)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, okKey)
	assert.Contains(t, out, "succeeded")
	code, out, errOut = idemOn("show", "--body", lostKey)
	printed.WriteString(out + errOut)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, `{"amount":4200}`, "a pending operation's journaled body")

	var st statsView
	decode(&st, "stats")
	assert.Equal(t, 1, st.ByState["pending"])
	assert.Equal(t, 1, st.ByState["succeeded"])
	code, out, errOut = idemOn("stats")
	printed.WriteString(out + errOut)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "schema "+schema)

	code, _, errOut = idemOn("verify")
	printed.WriteString(errOut)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "bbolt")

	code, _, errOut = runBin(t, bin, "--journal", dsn, "--schema", schema+"_none", "ls")
	printed.WriteString(errOut)
	assert.Equal(t, exitFailed, code)
	assert.Contains(t, errOut, "no journal at")
	var created bool
	require.NoError(t, look.Pool().QueryRow(context.Background(),
		`SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, schema+"_none").Scan(&created))
	assert.False(t, created, "the command never creates a journal")

	// The replica died: its lease lapses, and the operator gives up.
	waitLapsed(t, look, lostKey)
	code, out, errOut = idemOn("expire", "pay:lost")
	printed.WriteString(out + errOut)
	require.Equal(t, exitOK, code, errOut)
	op, err := look.Get(context.Background(), lostKey)
	require.NoError(t, err)
	assert.Equal(t, idem.StateExpired, op.State)

	if u, _ := strings.CutPrefix(dsn, "postgres://"); strings.Contains(u, ":") && strings.Contains(u, "@") {
		userinfo := u[:strings.Index(u, "@")]
		assert.NotContains(t, printed.String(), userinfo, "the URL's password is never printed")
	}
}

// TestSharedJournalNeverTakesALiveLease: an operation a running replica
// holds is neither expired nor resent by the command; pending says so.
func TestSharedJournalNeverTakesALiveLease(t *testing.T) {
	dsn, schema := pgJournalSchema(t)
	p := newRecorder(t)
	p.healed.Store(true)
	app := newReplica(t, dsn, schema, idem.WithOwner("replica-a"))
	leased := leasedByLiveReplica(t, app.store, p.URL+"/lost-leased", "Idempotency-Key")
	// A lapsed operation after it in key order: take's Claim meets it
	// first, and must give it back.
	later := forgeShared(t, app.store, "pay:later", p.URL+"/later", "Idempotency-Key", time.Now())
	_, idemOn := sharedIdem(t, dsn, schema)

	code, out, errOut := idemOn("pending")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "leased: a replica may be sending it")
	assert.Contains(t, out, "1 under a live lease")

	code, _, errOut = idemOn("expire", leased)
	assert.Equal(t, exitFailed, code)
	assert.Contains(t, errOut, "under a live lease of replica-b")
	op, err := app.store.Get(context.Background(), later)
	require.NoError(t, err)
	now, err := app.store.Now(context.Background())
	require.NoError(t, err)
	assert.False(t, op.LeaseUntil.After(now), "an operation expire met on its way is given back at once (owner %q)", op.Owner)

	code, _, errOut = idemOn("resume")
	if !keepsPolicy() {
		assert.Equal(t, exitFailed, code)
		assert.Contains(t, errOut, "does not keep the application's policy")
	} else {
		assert.Equal(t, exitOK, code, errOut)
	}
	assert.Empty(t, p.sentWith("Idempotency-Key", leased), "nothing is sent under another replica's live lease")
	op, err = app.store.Get(context.Background(), leased)
	require.NoError(t, err)
	assert.Equal(t, idem.StatePending, op.State)
	assert.Equal(t, "replica-b", op.Owner)
	require.NoError(t, app.c.Close())
}

// forgeShared journals a pending operation by hand, created at created,
// whose lease (of a replica that is gone) has lapsed. (pgstore reads a
// reserved lease as lasting from now as long as from the record's Updated:
// a lease that ends at Updated has lapsed.)
func forgeShared(t *testing.T, store *pgstore.Store, name, url, header string, created time.Time) string {
	t.Helper()
	key := uuid.Must(uuid.NewV7()).String()
	_, ok, err := store.Reserve(context.Background(), idem.Operation{
		Key: key, KeyHeader: header, Name: name, Method: http.MethodPost, URL: url, State: idem.StatePending,
		Created: created, Updated: created, Attempts: 1, Fingerprint: [32]byte{9},
		Owner: "replica-gone", LeaseUntil: created,
		Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"amount":2}`),
	})
	require.NoError(t, err)
	require.True(t, ok)
	return key
}

// TestSharedResumeActsUnderTheJournalsPolicy: on a PostgreSQL journal,
// resume sends each key in the header its operation was sent with
// (PayPal-Request-Id, not Idempotency-Key), expires what is past the
// journal's resend window without sending it, takes nothing a live
// replica holds, refuses a longer window, and leaves the policy as the
// application wrote it.
func TestSharedResumeActsUnderTheJournalsPolicy(t *testing.T) {
	if !keepsPolicy() {
		t.Skip("pgstore keeps no policy (idem.PolicyStore): resume refuses, see TestSharedJournalNeverTakesALiveLease")
	}
	dsn, schema := pgJournalSchema(t)
	p := newRecorder(t)
	policy := idem.Policy{KeyHeader: "PayPal-Request-Id", ResendWindow: 3 * time.Hour, Retention: 5 * time.Hour}
	app := newReplica(t, dsn, schema, idem.WithOwner("replica-a"), idem.WithLease(100*time.Millisecond),
		idem.WithKeyHeader(policy.KeyHeader), idem.WithResendWindow(policy.ResendWindow), idem.WithRetention(policy.Retention))
	lost := app.pay(t, "pay:lost", p.URL+"/lost")
	secret := app.payWith(t, "pay:secret", p.URL+"/lost-secret", "Bearer sk_live_not_journaled")
	require.NoError(t, app.c.Close())
	look := lookAt(t, dsn, schema)
	stored, err := look.Policy(context.Background())
	require.NoError(t, err)
	require.Equal(t, policy.ResendWindow, stored.ResendWindow, "the application journaled its policy")
	old := forgeShared(t, look, "pay:old", p.URL+"/old", policy.KeyHeader, time.Now().Add(-4*time.Hour))
	leased := leasedByLiveReplica(t, look, p.URL+"/leased", policy.KeyHeader)
	waitLapsed(t, look, lost)
	waitLapsed(t, look, secret)
	p.healed.Store(true)
	_, idemOn := sharedIdem(t, dsn, schema)

	code, _, errOut := idemOn("resume", "--resend-window", "10h")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "longer than the journal's resend window of 3h0m0s")

	code, out, errOut := idemOn("--json", "resume")
	require.Equal(t, exitOK, code, errOut)
	var got struct {
		Operations []resumeResult
		Summary    resumeSummary
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	byKey := map[string]resumeResult{}
	for _, r := range got.Operations {
		byKey[r.Key] = r
	}
	assert.Equal(t, "succeeded", byKey[lost].Outcome)
	assert.Equal(t, "expired", byKey[old].Outcome)
	assert.NotContains(t, byKey, leased, "an operation under a live lease is not taken")
	assert.Equal(t, "needs credentials", byKey[secret].Outcome)
	assert.Equal(t, resumeSummary{Sent: 1, Succeeded: 1, Expired: 1, Skipped: 1}, got.Summary)

	resent := p.sentWith("PayPal-Request-Id", lost)
	require.Len(t, resent, 3, "the replica's two attempts were cut, the command's answered: all under the application's header")
	for _, h := range resent {
		assert.Empty(t, h.Get("Idempotency-Key"), "no key in the default header")
	}
	assert.Empty(t, p.sentWith("PayPal-Request-Id", old), "past the journal's window: expired, not sent")
	assert.Empty(t, p.sentWith("PayPal-Request-Id", leased), "a live replica's operation is not sent")

	for key, want := range map[string]idem.State{lost: idem.StateSucceeded, old: idem.StateExpired, leased: idem.StatePending} {
		op, err := look.Get(context.Background(), key)
		require.NoError(t, err)
		assert.Equal(t, want, op.State, key)
	}
	op, err := look.Get(context.Background(), secret)
	require.NoError(t, err)
	assert.Equal(t, idem.StatePending, op.State)
	assert.True(t, strings.HasPrefix(op.Owner, "idem-command@"), "the command took it under its own name: %q", op.Owner)
	now, err := look.Now(context.Background())
	require.NoError(t, err)
	assert.False(t, op.LeaseUntil.After(now), "the command released what it left pending: a replica may take it at once")
	after, err := look.Policy(context.Background())
	require.NoError(t, err)
	assert.Equal(t, stored, after, "the command never writes its own policy")
}

// TestSharedGCKeepsTheFloor: gc on a PostgreSQL journal refuses a
// retention below the journal's floor (resend window plus an hour), and
// the named operation keeps its key.
func TestSharedGCKeepsTheFloor(t *testing.T) {
	dsn, schema := pgJournalSchema(t)
	p := newRecorder(t)
	app := newReplica(t, dsn, schema, idem.WithResendWindow(3*time.Hour), idem.WithRetention(5*time.Hour))
	okKey := app.pay(t, "pay:ok", p.URL+"/ok")
	require.NoError(t, app.c.Close())
	look := lookAt(t, dsn, schema)
	_, idemOn := sharedIdem(t, dsn, schema)

	code, _, errOut := idemOn("gc", "--retention", "0s")
	if !keepsPolicy() {
		assert.Equal(t, exitFailed, code)
		assert.Contains(t, errOut, "does not keep the application's policy")
		return
	}
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "below the journal's floor of 4h0m0s")
	code, out, errOut := idemOn("--json", "gc", "--retention", "4h", "--dry-run")
	require.Equal(t, exitOK, code, errOut)
	var dry struct {
		WouldSweep int `json:"would_sweep"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &dry), out)
	assert.Zero(t, dry.WouldSweep)
	code, out, errOut = idemOn("gc")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "swept 0 finished operations")

	op, err := look.Named(context.Background(), "pay:ok")
	require.NoError(t, err)
	assert.Equal(t, okKey, op.Key, "the name still maps to its key")
}
