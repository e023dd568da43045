package idem_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// adyenInProgress is Adyen's answer to a duplicate that arrives while the
// first request under its key is still being processed.
func adyenInProgress(status int) step {
	s := body(status, `{"status":`+strconv.Itoa(status)+`,"errorCode":"704","message":"request already processed or in progress","errorType":"validation"}`)
	return withHeader(s, "Transient-Error", "true")
}

// TestAdyenInProgressIsRetried: a first attempt cut after it was sent, then
// Adyen's 704 "in progress" (422, or 409) with transient-error: true, then
// the payment's answer. The caller gets the 200; the operation succeeds.
func TestAdyenInProgressIsRetried(t *testing.T) {
	for _, status := range []int{422, 409} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			rt := &scriptRT{steps: []step{fail(errReset), adyenInProgress(status), resp(200)}}
			c, store := newTestClient(rt, idem.WithProvider(idem.Adyen), idem.WithBackoff(time.Millisecond, time.Millisecond))
			defer c.Close()
			r, err := post(t, context.Background(), c.HTTPClient(), `{"amount":1}`)
			require.NoError(t, err)
			io.Copy(io.Discard, r.Body)
			r.Body.Close()
			assert.Equal(t, 200, r.StatusCode)
			require.Len(t, rt.sent, 3)
			op, err := store.Get(t.Context(), rt.sent[0].key)
			require.NoError(t, err)
			assert.Equal(t, idem.StateSucceeded, op.State)
		})
	}
}

// TestAdyenOther422IsFinal: a 422 without the 704 code or the hint is a
// validation error, final.
func TestAdyenOther422IsFinal(t *testing.T) {
	rt := &scriptRT{steps: []step{body(422, `{"status":422,"errorCode":"14_030","message":"Return URL is missing.","errorType":"validation"}`), resp(200)}}
	c, _ := newTestClient(rt, idem.WithProvider(idem.Adyen), idem.WithBackoff(time.Millisecond, time.Millisecond))
	defer c.Close()
	r, err := post(t, context.Background(), c.HTTPClient(), `{"amount":1}`)
	require.NoError(t, err)
	r.Body.Close()
	assert.Equal(t, 422, r.StatusCode)
	assert.Len(t, rt.sent, 1)
}

// goCardlessConflict is GoCardless's answer to a key a resource was
// already created under.
const goCardlessConflict = `{"error":{"code":409,"type":"invalid_state","message":"A resource has already been created with this idempotency key",` +
	`"documentation_url":"https://developer.gocardless.com/api-reference#idempotent_creation_conflict","request_id":"0a4bd1f0",` +
	`"errors":[{"reason":"idempotent_creation_conflict","message":"A resource has already been created with this idempotency key",` +
	`"links":{"conflicting_resource_id":"PM00001EKBQ412"}}]}}`

// TestGoCardlessConflictIsPerformed: the first attempt is cut after it was
// sent, the retry gets GoCardless's idempotent_creation_conflict: the
// payment was made. idem sends nothing more, records the operation as
// performed (succeeded, never pending, never failed) with the conflicting
// resource's id, and the caller's response says so too.
func TestGoCardlessConflictIsPerformed(t *testing.T) {
	rt := &scriptRT{steps: []step{fail(errReset), body(409, goCardlessConflict)}}
	c, store := newTestClient(rt, idem.WithProvider(idem.GoCardless), idem.WithBackoff(time.Millisecond, time.Millisecond))
	defer c.Close()
	r, err := post(t, context.Background(), c.HTTPClient(), `{"payments":{"amount":100}}`)
	require.NoError(t, err)
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	assert.Equal(t, 409, r.StatusCode)
	assert.JSONEq(t, goCardlessConflict, string(b), "the caller reads the body as GoCardless sent it")
	assert.Len(t, rt.sent, 2, "nothing is sent after the conflict")
	assert.Equal(t, idem.GoCardless.Header, "Idempotency-Key")

	p, ok := idem.PerformedOf(r)
	require.True(t, ok, "the response says it was performed")
	assert.Equal(t, "PM00001EKBQ412", p.Resource)

	op, err := store.Get(t.Context(), rt.sent[0].key)
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, op.State, "performed: never pending, never failed")
	assert.Contains(t, op.LastError, "performed by server, answer not kept")
	assert.Contains(t, op.LastError, "PM00001EKBQ412")
	pending, err := c.Pending(t.Context(), "", 10)
	require.NoError(t, err)
	assert.Empty(t, pending)
}

// TestPerformedOfIgnoresOtherAnswers: a 409 that is not a "performed"
// answer, or a server's own header of that name, is no such answer.
func TestPerformedOfIgnoresOtherAnswers(t *testing.T) {
	rt := &scriptRT{steps: []step{withHeader(body(409, `{"error":{"type":"invalid_state","errors":[{"reason":"mandate_is_inactive"}]}}`), idem.PerformedHeader, "resource=X")}}
	c, _ := newTestClient(rt, idem.WithProvider(idem.GoCardless), idem.WithMaxAttempts(1))
	defer c.Close()
	r, err := post(t, context.Background(), c.HTTPClient(), `{}`)
	require.NoError(t, err)
	r.Body.Close()
	_, ok := idem.PerformedOf(r)
	assert.False(t, ok)
	_, ok = idem.PerformedOf(nil)
	assert.False(t, ok)
}

// TestPerformedOfIgnoresUnkeyedAnswers: an answer to a request sent
// without a key, a server's header of that name or a provider's performed
// code on it, is no "performed under its key" answer either.
func TestPerformedOfIgnoresUnkeyedAnswers(t *testing.T) {
	rt := &scriptRT{steps: []step{
		withHeader(body(200, `{}`), idem.PerformedHeader, "resource=X"),
		body(409, goCardlessConflict),
	}}
	c, _ := newTestClient(rt, idem.WithProvider(idem.GoCardless), idem.WithMaxAttempts(1))
	defer c.Close()
	req, err := http.NewRequest(http.MethodGet, "http://api.test/x", nil)
	require.NoError(t, err)
	r, err := c.HTTPClient().Do(req)
	require.NoError(t, err)
	r.Body.Close()
	_, ok := idem.PerformedOf(r)
	assert.False(t, ok, "a GET's answer with the server's header")
	req, err = http.NewRequest(http.MethodPost, "http://api.test/x", nil)
	require.NoError(t, err)
	r, err = c.HTTPClient().Do(req.WithContext(idem.WithoutKey(context.Background())))
	require.NoError(t, err)
	r.Body.Close()
	_, ok = idem.PerformedOf(r)
	assert.False(t, ok, "an unkeyed POST's 409 in the provider's performed code")
}

// TestReDriveSendsUnderTheOperationsKeyHeader: an operation journaled
// under PayPal-Request-Id, left in doubt, and re-driven by name from a
// Client with the default header is sent under PayPal-Request-Id.
func TestReDriveSendsUnderTheOperationsKeyHeader(t *testing.T) {
	store := sharedStore{idem.NewMemoryStore()}
	lost := &scriptRT{steps: []step{{err: errors.New("connection reset")}}}
	c := idem.New(store, idem.WithBaseTransport(lost), idem.WithKeyHeader("PayPal-Request-Id"), idem.WithMaxAttempts(1))
	ctx := idem.WithOperation(context.Background(), "pay:1")
	_, err := post(t, ctx, c.HTTPClient(), `{"amount":1}`)
	require.Error(t, err)
	require.NoError(t, c.Close())
	key := lost.sent[0].header.Get("PayPal-Request-Id")
	require.NotEmpty(t, key)

	rt := &scriptRT{steps: []step{resp(201)}}
	c = idem.New(store, idem.WithBaseTransport(rt))
	defer c.Close()
	for _, ctx := range []context.Context{ctx, idem.WithKey(context.Background(), key)} {
		r, err := post(t, ctx, c.HTTPClient(), `{"amount":1}`)
		require.NoError(t, err)
		r.Body.Close()
	}
	require.Len(t, rt.sent, 2)
	for _, s := range rt.sent {
		assert.Equal(t, key, s.header.Get("PayPal-Request-Id"))
		assert.Empty(t, s.header.Get("Idempotency-Key"), "no key in the default header")
	}
}

// TestKeyOnUnkeyedMethodIsAnError: WithKey or WithOperation on a method
// the Client does not key is refused, not dropped; nothing is sent.
func TestKeyOnUnkeyedMethodIsAnError(t *testing.T) {
	for _, m := range []string{http.MethodDelete, http.MethodGet, http.MethodPut} {
		for name, ctx := range map[string]context.Context{
			"WithKey":       idem.WithKey(context.Background(), "k-1"),
			"WithOperation": idem.WithOperation(context.Background(), "refund:1"),
		} {
			t.Run(m+"/"+name, func(t *testing.T) {
				rt := &scriptRT{steps: []step{resp(200)}}
				c, _ := newTestClient(rt)
				defer c.Close()
				req, err := http.NewRequestWithContext(ctx, m, "https://pay.example/v1/charges/ch_1", nil)
				require.NoError(t, err)
				_, err = c.HTTPClient().Do(req)
				require.ErrorIs(t, err, idem.ErrNotKeyed)
				require.ErrorIs(t, err, idem.ErrInvalidRequest)
				assert.Empty(t, rt.sent)
			})
		}
	}
}

// TestStripeV2KeysDelete: with idem.StripeV2 a DELETE is keyed and
// journaled; a GET is not.
func TestStripeV2KeysDelete(t *testing.T) {
	rt := &scriptRT{steps: []step{fail(errReset), resp(200)}}
	c, store := newTestClient(rt, idem.WithProvider(idem.StripeV2), idem.WithBackoff(time.Millisecond, time.Millisecond))
	defer c.Close()
	req, err := http.NewRequestWithContext(idem.WithOperation(context.Background(), "delete:acct_1"),
		http.MethodDelete, "https://api.stripe.com/v2/core/accounts/acct_1/persons/p_1", nil)
	require.NoError(t, err)
	r, err := c.HTTPClient().Do(req)
	require.NoError(t, err)
	r.Body.Close()
	require.Len(t, rt.sent, 2)
	k := rt.sent[0].key
	require.NotEmpty(t, k)
	assert.Equal(t, k, rt.sent[1].key, "the retry carries the same key")
	op, err := store.Named(t.Context(), "delete:acct_1")
	require.NoError(t, err)
	assert.Equal(t, http.MethodDelete, op.Method)
	assert.Equal(t, idem.StateSucceeded, op.State)
	assert.Equal(t, 30*24*time.Hour, idem.StripeV2.Retention)

	rt2 := &scriptRT{steps: []step{resp(200)}}
	c2, _ := newTestClient(rt2, idem.WithProvider(idem.StripeV2))
	defer c2.Close()
	get, err := http.NewRequest(http.MethodGet, "https://api.stripe.com/v2/core/accounts/acct_1", nil)
	require.NoError(t, err)
	r, err = c2.HTTPClient().Do(get)
	require.NoError(t, err)
	r.Body.Close()
	assert.Empty(t, rt2.sent[0].key, "a GET carries no key")
}

// legacyStore is a store as it was before records kept their key header:
// it drops Operation.KeyHeader.
type legacyStore struct{ *idem.MemoryStore }

func (s legacyStore) Reserve(ctx context.Context, op idem.Operation) (idem.Operation, bool, error) {
	op.KeyHeader = ""
	return s.MemoryStore.Reserve(ctx, op)
}

func (legacyStore) Close() error { return nil }

// TestRecordWithoutKeyHeaderIsNeverSentUnderAGuess: a record from before
// records kept their key header is resumed and re-driven under the header
// the application names, and refused by a Client that names none.
func TestRecordWithoutKeyHeaderIsNeverSentUnderAGuess(t *testing.T) {
	store := legacyStore{idem.NewMemoryStore()}
	lost := &scriptRT{steps: []step{{err: errors.New("connection reset")}}}
	c := idem.New(store, idem.WithBaseTransport(lost), idem.WithKeyHeader("PayPal-Request-Id"), idem.WithMaxAttempts(1), idem.WithOwner("app"))
	ctx := idem.WithOperation(context.Background(), "pay:1")
	_, err := post(t, ctx, c.HTTPClient(), `{"amount":1}`)
	require.Error(t, err)
	require.NoError(t, c.Close())
	key := lost.sent[0].header.Get("PayPal-Request-Id")
	op, err := store.Get(t.Context(), key)
	require.NoError(t, err)
	require.Empty(t, op.KeyHeader, "the record keeps no header")

	// A Client left at the default header refuses it, by name and by Resume.
	rt := &scriptRT{steps: []step{resp(201)}}
	c = idem.New(store, idem.WithBaseTransport(rt), idem.WithOwner("app")) // the same application: Resume's claim does not hold it off
	_, err = post(t, ctx, c.HTTPClient(), `{"amount":1}`)
	require.ErrorIs(t, err, idem.ErrNotRetryable)
	assert.Contains(t, err.Error(), "key header")
	var got error
	require.NoError(t, c.Resume(t.Context(), func(_ idem.Operation, r *http.Response, err error) {
		got = err
		if r != nil {
			r.Body.Close()
		}
	}))
	require.ErrorIs(t, got, idem.ErrNotRetryable)
	assert.Empty(t, rt.sent, "nothing is sent under a guess")
	op, err = store.Get(t.Context(), key)
	require.NoError(t, err)
	assert.Equal(t, idem.StatePending, op.State, "it stays pending for a Client that names its header")
	require.NoError(t, c.Close())

	// One that names it sends it there.
	c = idem.New(store, idem.WithBaseTransport(rt), idem.WithProvider(idem.PayPal), idem.WithOwner("app"))
	defer c.Close()
	r, err := post(t, ctx, c.HTTPClient(), `{"amount":1}`)
	require.NoError(t, err)
	r.Body.Close()
	require.Len(t, rt.sent, 1)
	assert.Equal(t, key, rt.sent[0].header.Get("PayPal-Request-Id"))
}
