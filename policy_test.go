package idem_test

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

func TestOpenWritesItsPolicyIntoTheJournal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	c, err := idem.Open(path, idem.WithKeyHeader("paypal-request-id"), idem.WithResendWindow(47*time.Hour), idem.WithResendMatchWindow(2*time.Minute))
	require.NoError(t, err)
	require.NoError(t, c.Close())
	s, err := idem.OpenBoltStore(path, nil)
	require.NoError(t, err)
	defer s.Close()
	p, err := s.Policy(t.Context())
	require.NoError(t, err)
	assert.Equal(t, idem.Policy{KeyHeader: "Paypal-Request-Id", ResendWindow: 47 * time.Hour, Retention: 48 * time.Hour, MatchWindow: 2 * time.Minute}, p)
}

func TestLooserPolicyIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	c, err := idem.Open(path) // the defaults: a 23 h window, 25 h retention
	require.NoError(t, err)
	require.NoError(t, c.Close())

	// A 47 h window needs names kept 48 h; the journal keeps them 25 h.
	_, err = idem.Open(path, idem.WithResendWindow(47*time.Hour))
	require.ErrorIs(t, err, idem.ErrPolicyConflict)
	assert.Contains(t, err.Error(), "WithRetention(48h0m0s)", "the error says what to do")

	// Raising the retention first is allowed, and then the window.
	c, err = idem.Open(path, idem.WithRetention(48*time.Hour))
	require.NoError(t, err)
	require.NoError(t, c.Close())
	c, err = idem.Open(path, idem.WithResendWindow(47*time.Hour))
	require.NoError(t, err)
	require.NoError(t, c.Close())

	// Going back to the defaults would sweep names the 47 h window needs.
	_, err = idem.Open(path)
	require.ErrorIs(t, err, idem.ErrPolicyConflict)
}

func TestNewWithLooserPolicySendsNothing(t *testing.T) {
	store := idem.NewMemoryStore()
	require.NoError(t, store.SetPolicy(t.Context(), idem.Policy{ResendWindow: 23 * time.Hour, Retention: 25 * time.Hour}))
	rt := &scriptRT{steps: []step{resp(201)}}
	c := idem.New(store, idem.WithBaseTransport(rt), idem.WithResendWindow(47*time.Hour))
	defer c.Close()
	_, err := post(t, idem.WithOperation(context.Background(), "pay:1"), c.HTTPClient(), `{"amount":1}`)
	require.ErrorIs(t, err, idem.ErrPolicyConflict)
	assert.Empty(t, rt.sent, "nothing sent")
	require.ErrorIs(t, c.Resume(t.Context(), nil), idem.ErrPolicyConflict)
	p, err := store.Policy(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 23*time.Hour, p.ResendWindow, "the journal's policy is unchanged")
}

func TestResumeSendsUnderTheOperationsKeyHeader(t *testing.T) {
	store := sharedStore{idem.NewMemoryStore()}
	lost := &scriptRT{steps: []step{{err: errors.New("connection reset")}}}
	c := idem.New(store, idem.WithBaseTransport(lost), idem.WithKeyHeader("PayPal-Request-Id"), idem.WithMaxAttempts(1))
	_, err := post(t, idem.WithOperation(context.Background(), "pay:1"), c.HTTPClient(), `{"amount":1}`)
	require.Error(t, err)
	require.NoError(t, c.Close())
	key := lost.sent[0].header.Get("PayPal-Request-Id")
	require.NotEmpty(t, key)

	// A later release (or the command) with the default header resumes it:
	// the key still travels in PayPal-Request-Id.
	rt := &scriptRT{steps: []step{resp(201)}}
	c = idem.New(store, idem.WithBaseTransport(rt))
	defer c.Close()
	require.NoError(t, c.Resume(t.Context(), func(op idem.Operation, r *http.Response, err error) {
		require.NoError(t, err)
		r.Body.Close()
	}))
	require.Len(t, rt.sent, 1)
	assert.Equal(t, key, rt.sent[0].header.Get("PayPal-Request-Id"))
	assert.Empty(t, rt.sent[0].header.Get("Idempotency-Key"), "no key in the default header")
}

func TestExpiredIsFinal(t *testing.T) {
	store := sharedStore{idem.NewMemoryStore()}
	lost := &scriptRT{steps: []step{{err: errors.New("connection reset")}}}
	c := idem.New(store, idem.WithBaseTransport(lost), idem.WithMaxAttempts(1))
	ctx := idem.WithOperation(context.Background(), "pay:1")
	_, err := post(t, ctx, c.HTTPClient(), `{"amount":1}`)
	require.Error(t, err)
	require.NoError(t, c.Close())
	key := lost.sent[0].key
	// The operator gives it up (what idem expire does).
	require.NoError(t, store.Finish(t.Context(), key, idem.Outcome{State: idem.StateExpired, Err: "expired by operator", At: time.Now()}))

	rt := &scriptRT{steps: []step{resp(201)}}
	c = idem.New(store, idem.WithBaseTransport(rt))
	defer c.Close()
	for name, ctx := range map[string]context.Context{
		"by name": ctx,
		"by key":  idem.WithKey(context.Background(), key),
	} {
		_, err := post(t, ctx, c.HTTPClient(), `{"amount":1}`)
		require.ErrorIs(t, err, idem.ErrExpired, name)
		var ie *idem.Error
		require.ErrorAs(t, err, &ie, name)
		assert.Equal(t, key, ie.Key, name)
	}
	require.NoError(t, c.Resume(t.Context(), func(op idem.Operation, r *http.Response, err error) {
		t.Errorf("Resume delivered %s", op.Key)
	}))
	assert.Empty(t, rt.sent, "an expired operation is never sent again")
	op, err := store.Get(t.Context(), key)
	require.NoError(t, err)
	assert.Equal(t, idem.StateExpired, op.State)
}
