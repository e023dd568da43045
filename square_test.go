package idem_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// squareFake answers as Square's idempotency page says: the key is the
// JSON body's idempotency_key; a repeat of the same request returns the
// first answer without taking the payment again; the same key with another
// request is IDEMPOTENCY_KEY_REUSED. With cut set, it takes the first
// payment and then drops the connection before answering.
type squareFake struct {
	mu       sync.Mutex
	payments int
	seen     map[string]string // key → request body
	cut      bool
	keys     []string // the key of every request, in order
}

func (f *squareFake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var req struct {
		Key string `json:"idempotency_key"`
	}
	if json.Unmarshal(b, &req) != nil || req.Key == "" {
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"errors":[{"category":"INVALID_REQUEST_ERROR","code":"MISSING_REQUIRED_PARAMETER","field":"idempotency_key"}]}`)
		return
	}
	f.mu.Lock()
	f.keys = append(f.keys, req.Key)
	first, ok := f.seen[req.Key]
	if !ok {
		f.seen[req.Key] = string(b)
		f.payments++
		cut := f.cut
		f.cut = false
		f.mu.Unlock()
		if cut {
			panic(http.ErrAbortHandler) // performed, the answer lost
		}
		io.WriteString(w, `{"payment":{"id":"pay_1","status":"COMPLETED"}}`)
		return
	}
	f.mu.Unlock()
	if first != string(b) {
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"errors":[{"category":"INVALID_REQUEST_ERROR","code":"IDEMPOTENCY_KEY_REUSED"}]}`)
		return
	}
	io.WriteString(w, `{"payment":{"id":"pay_1","status":"COMPLETED"}}`)
}

func squarePost(t *testing.T, ctx context.Context, c *idem.Client, url, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v2/payments", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	return c.HTTPClient().Do(req)
}

// TestSquareKeyInTheBody: under idem.Square the key is written into the
// body before it is journaled and first sent. A first attempt cut after
// Square took the payment is retried with the same body key and replayed;
// a re-drive by name after a restart carries the journaled key; another
// payload under the name is refused before anything is sent; a body
// holding its own key keeps it; a body that is not a JSON object is
// refused.
func TestSquareKeyInTheBody(t *testing.T) {
	f := &squareFake{seen: map[string]string{}, cut: true}
	srv := httptest.NewServer(f)
	defer srv.Close()
	store := sharedStore{idem.NewMemoryStore()}
	opts := []idem.Option{idem.WithProvider(idem.Square), idem.WithBaseTransport(srv.Client().Transport),
		idem.WithBackoff(time.Millisecond, time.Millisecond), idem.WithOwner("shop")}
	c := idem.New(store, opts...)
	ctx := idem.WithOperation(context.Background(), "pay:order-7")
	const payment = `{"amount_money":{"amount":100,"currency":"USD"},"source_id":"cnon:card"}`
	r, err := squarePost(t, ctx, c, srv.URL, payment)
	require.NoError(t, err)
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	assert.Equal(t, 200, r.StatusCode, "%s", b)
	f.mu.Lock()
	require.Len(t, f.keys, 2, "the cut attempt and its retry")
	key := f.keys[0]
	assert.Equal(t, key, f.keys[1], "the retry carries the same body key")
	assert.Equal(t, 1, f.payments, "one payment")
	f.mu.Unlock()
	op, err := store.Named(t.Context(), "pay:order-7")
	require.NoError(t, err)
	assert.Equal(t, key, op.Key, "the body's key is the journal's")
	require.NoError(t, c.Close())

	// A restarted process re-drives the name: same key in the body, replayed.
	c = idem.New(store, opts...)
	defer c.Close()
	r, err = squarePost(t, ctx, c, srv.URL, payment)
	require.NoError(t, err)
	r.Body.Close()
	assert.Equal(t, 200, r.StatusCode)
	f.mu.Lock()
	assert.Equal(t, key, f.keys[2])
	assert.Equal(t, 1, f.payments)
	f.mu.Unlock()

	// Another payload under the name: refused, nothing sent.
	_, err = squarePost(t, ctx, c, srv.URL, `{"amount_money":{"amount":999,"currency":"USD"},"source_id":"cnon:card"}`)
	require.ErrorIs(t, err, idem.ErrKeyReused)

	// A body with its own key keeps it.
	r, err = squarePost(t, context.Background(), c, srv.URL, `{"idempotency_key":"mine-1","amount_money":{"amount":5,"currency":"USD"}}`)
	require.NoError(t, err)
	r.Body.Close()
	f.mu.Lock()
	assert.Equal(t, "mine-1", f.keys[len(f.keys)-1])
	sent := len(f.keys)
	f.mu.Unlock()
	_, err = store.Get(t.Context(), "mine-1")
	require.NoError(t, err, "journaled under the body's key")

	// Not a JSON object: refused before anything is journaled or sent.
	_, err = squarePost(t, context.Background(), c, srv.URL, `amount=5`)
	require.ErrorIs(t, err, idem.ErrInvalidRequest)
	f.mu.Lock()
	assert.Len(t, f.keys, sent)
	f.mu.Unlock()
}

// TestSquareResumeSendsTheJournaledBodyKey: an attempt cut after Square
// took the payment leaves the operation in doubt; its journaled body
// holds the key, and Resume sends it so: replayed, one payment.
func TestSquareResumeSendsTheJournaledBodyKey(t *testing.T) {
	f := &squareFake{seen: map[string]string{}, cut: true}
	srv := httptest.NewServer(f)
	defer srv.Close()
	store := sharedStore{idem.NewMemoryStore()}
	c := idem.New(store, idem.WithProvider(idem.Square), idem.WithBaseTransport(srv.Client().Transport), idem.WithMaxAttempts(1))
	_, err := squarePost(t, context.Background(), c, srv.URL, `{"amount_money":{"amount":100,"currency":"USD"}}`)
	require.Error(t, err)
	require.NoError(t, c.Close())
	f.mu.Lock()
	key := f.keys[0]
	f.mu.Unlock()
	op, err := store.Get(t.Context(), key)
	require.NoError(t, err)
	assert.JSONEq(t, `{"idempotency_key":"`+key+`","amount_money":{"amount":100,"currency":"USD"}}`, string(op.Body), "the journaled body carries the key")

	c = idem.New(store, idem.WithProvider(idem.Square), idem.WithBaseTransport(srv.Client().Transport))
	defer c.Close()
	fn, got := collect()
	require.NoError(t, c.Resume(t.Context(), fn))
	require.Len(t, got.list(), 1)
	assert.Equal(t, 200, got.list()[0].status)
	f.mu.Lock()
	defer f.mu.Unlock()
	assert.Equal(t, []string{key, key}, f.keys)
	assert.Equal(t, 1, f.payments)
}
