package idemserver_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemserver"
)

// whsec is a Standard Webhooks secret and its key.
const whsec = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// standardDelivery returns a delivery of body with event id id, signed
// with secret (base64 key) at ts.
func standardDelivery(id, body, secret string, ts time.Time) *http.Request {
	key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	t := strconv.FormatInt(ts.Unix(), 10)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + t + "." + body))
	r := httptest.NewRequest(http.MethodPost, "/hooks/psp", strings.NewReader(body))
	r.Header.Set("Webhook-Id", id)
	r.Header.Set("Webhook-Timestamp", t)
	r.Header.Set("Webhook-Signature", "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	return r
}

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestForgedWebhookCountsForNothing is finding 2 of issue 35: a forged
// delivery carrying a real upcoming event id gets 401 and stores nothing,
// so the real, signed delivery runs the handler; an unsigned delivery of
// a processed id does not get the stored answer; a signed redelivery does.
func TestForgedWebhookCountsForNothing(t *testing.T) {
	forStores(t, func(t *testing.T, s idemserver.Store) {
		a := &app{answer: func(w http.ResponseWriter, r *http.Request, run int) {
			w.WriteHeader(http.StatusOK)
			w.Write([]byte("handled evt_1 for customer cus_secret"))
		}}
		mw := idemserver.New(s, idemserver.WithWebhookClientErrors(true),
			idemserver.WithWebhookVerify(idemserver.StandardWebhooks(whsec, 0)))
		defer mw.Close()
		h := mw.Webhook(a, nil)
		now := time.Now()

		forged := standardDelivery("evt_1", `{"amount":1}`, "whsec_"+base64.StdEncoding.EncodeToString([]byte("attacker")), now)
		w := serve(h, forged)
		assert.Equal(t, http.StatusUnauthorized, w.Code)
		assert.Equal(t, idemserver.ProblemUnauthorized, problemType(t, w))
		unsigned := httptest.NewRequest(http.MethodPost, "/hooks/psp", strings.NewReader(`{}`))
		unsigned.Header.Set("Webhook-Id", "evt_1")
		assert.Equal(t, http.StatusUnauthorized, serve(h, unsigned).Code)
		stale := standardDelivery("evt_1", `{"amount":100}`, whsec, now.Add(-10*time.Minute))
		assert.Equal(t, http.StatusUnauthorized, serve(h, stale).Code)
		assert.EqualValues(t, 0, a.runs.Load(), "a delivery that does not verify ran the handler")

		real := serve(h, standardDelivery("evt_1", `{"amount":100}`, whsec, now))
		require.Equal(t, http.StatusOK, real.Code, "the real delivery was blocked: %s", real.Body)
		assert.Empty(t, real.Header().Get(idemserver.ReplayedHeader))
		assert.EqualValues(t, 1, a.runs.Load())

		// The processed id's answer goes to a delivery that verifies only.
		unsigned = httptest.NewRequest(http.MethodPost, "/hooks/psp", strings.NewReader(`{}`))
		unsigned.Header.Set("Webhook-Id", "evt_1")
		w = serve(h, unsigned)
		assert.Equal(t, http.StatusUnauthorized, w.Code)
		assert.NotContains(t, w.Body.String(), "cus_secret")
		again := serve(h, standardDelivery("evt_1", `{"amount":100}`, whsec, now.Add(time.Minute)))
		assert.Equal(t, "true", again.Header().Get(idemserver.ReplayedHeader))
		assert.EqualValues(t, 1, a.runs.Load())
	})
}

// TestStandardWebhooksVector checks the verifier against the example of
// the Standard Webhooks specification (and Svix's documentation), sent
// with Svix's header names.
func TestStandardWebhooksVector(t *testing.T) {
	v := idemserver.StandardWebhooks(whsec, 0)
	body := []byte(`{"test": 2432232314}`)
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set("Svix-Id", "msg_p5jXN8AQM9LWM0D4loKWxJek")
	r.Header.Set("Svix-Timestamp", "1614265330")
	r.Header.Set("Svix-Signature", "v1,bm9wZQ== v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
	at := time.Unix(1614265330, 0)
	assert.NoError(t, v(r, body, at.Add(time.Minute)))
	assert.ErrorIs(t, v(r, body, at.Add(6*time.Minute)), idemserver.ErrWebhookSignature, "too old")
	assert.ErrorIs(t, v(r, body, at.Add(-6*time.Minute)), idemserver.ErrWebhookSignature, "too new")
	assert.ErrorIs(t, v(r, []byte(`{"test": 1}`), at), idemserver.ErrWebhookSignature, "other body")
	assert.ErrorIs(t, idemserver.StandardWebhooks("whsec_not base64!", 0)(r, body, at), idemserver.ErrWebhookSecret)
}

// TestStripeSignature: the Stripe-Signature scheme, the event id from the
// body, a forged and a signed delivery through the middleware.
func TestStripeSignature(t *testing.T) {
	const secret = "whsec_test_secret"
	sign := func(body string, ts time.Time, key string) *http.Request {
		t := strconv.FormatInt(ts.Unix(), 10)
		mac := hmac.New(sha256.New, []byte(key))
		mac.Write([]byte(t + "." + body))
		r := httptest.NewRequest(http.MethodPost, "/hooks/stripe", strings.NewReader(body))
		r.Header.Set("Stripe-Signature", "t="+t+",v1="+hex.EncodeToString(mac.Sum(nil))+",v0=deadbeef")
		return r
	}
	forStores(t, func(t *testing.T, s idemserver.Store) {
		a := &app{answer: func(w http.ResponseWriter, r *http.Request, run int) { w.WriteHeader(http.StatusOK) }}
		mw := idemserver.New(s, idemserver.WithWebhookVerify(idemserver.StripeSignature(secret, time.Minute)))
		defer mw.Close()
		h := mw.Webhook(a, idemserver.JSONEventID("id"))
		now := time.Now()
		body := `{"id":"evt_1","type":"charge.succeeded"}`
		assert.Equal(t, http.StatusUnauthorized, serve(h, sign(body, now, "whsec_forged")).Code)
		assert.Equal(t, http.StatusUnauthorized, serve(h, sign(body, now.Add(-2*time.Minute), secret)).Code, "outside the tolerance")
		noSig := httptest.NewRequest(http.MethodPost, "/hooks/stripe", strings.NewReader(body))
		assert.Equal(t, http.StatusUnauthorized, serve(h, noSig).Code)
		assert.EqualValues(t, 0, a.runs.Load())
		assert.Equal(t, http.StatusOK, serve(h, sign(body, now, secret)).Code)
		assert.Equal(t, "true", serve(h, sign(body, now, secret)).Header().Get(idemserver.ReplayedHeader))
		assert.EqualValues(t, 1, a.runs.Load())
	})
}
