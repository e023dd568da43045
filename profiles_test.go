package idem_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// TestProfilesReadTheirAnswers scripts each profile's documented answers
// (see each profile's Source): an "in progress" answer is retried under the
// same key until the payment's answer comes; a "key reused" answer is final,
// sent once; and when attempts run out on "in progress", the operation stays
// pending (in doubt), never failed.
func TestProfilesReadTheirAnswers(t *testing.T) {
	inProgress := []struct {
		name string
		p    idem.Provider
		busy step
	}{
		{"Stripe/409 idempotency_key_in_use", idem.Stripe, body(409, `{"error":{"type":"idempotency_error","code":"idempotency_key_in_use"}}`)},
		{"Adyen/422 704", idem.Adyen, withHeader(body(422, `{"status":422,"errorCode":"704","errorType":"validation"}`), "Transient-Error", "true")},
		{"Adyen/409 704 without the hint", idem.Adyen, body(409, `{"status":409,"errorCode":"704"}`)},
		{"Worldline/409", idem.Worldline, body(409, `{}`)},
		{"CheckoutCom/429", idem.CheckoutCom, body(429, `{}`)},
	}
	for _, tc := range inProgress {
		t.Run("in progress/"+tc.name, func(t *testing.T) {
			rt := &scriptRT{steps: []step{tc.busy, resp(200)}}
			c, store := newTestClient(rt, idem.WithProvider(tc.p), idem.WithBackoff(time.Millisecond, time.Millisecond))
			defer c.Close()
			r, err := post(t, context.Background(), c.HTTPClient(), `{"amount":1}`)
			require.NoError(t, err)
			io.Copy(io.Discard, r.Body)
			r.Body.Close()
			assert.Equal(t, 200, r.StatusCode)
			require.Len(t, rt.sent, 2)
			k := rt.sent[0].header.Get(tc.p.Header)
			assert.Equal(t, k, rt.sent[1].header.Get(tc.p.Header), "the same key")
			op, err := store.Get(t.Context(), k)
			require.NoError(t, err)
			assert.Equal(t, idem.StateSucceeded, op.State)
		})
		t.Run("in progress until attempts run out/"+tc.name, func(t *testing.T) {
			rt := &scriptRT{steps: []step{tc.busy}}
			c, store := newTestClient(rt, idem.WithProvider(tc.p), idem.WithBackoff(time.Millisecond, time.Millisecond), idem.WithMaxAttempts(2))
			defer c.Close()
			r, err := post(t, context.Background(), c.HTTPClient(), `{"amount":1}`)
			require.NoError(t, err)
			io.Copy(io.Discard, r.Body)
			r.Body.Close()
			assert.Equal(t, tc.busy.status, r.StatusCode, "the last answer is returned")
			op, err := store.Get(t.Context(), rt.sent[0].header.Get(tc.p.Header))
			require.NoError(t, err)
			if tc.busy.status == 429 {
				assert.Equal(t, idem.StateFailed, op.State, "a 429 says nothing about the first request: idem's table")
				return
			}
			assert.Equal(t, idem.StatePending, op.State, "in progress: in doubt, never failed")
		})
	}
	reused := []struct {
		name string
		p    idem.Provider
		ans  step
	}{
		{"Stripe/400 idempotency_error", idem.Stripe, body(400, `{"error":{"type":"idempotency_error","message":"Keys for idempotent requests can only be used with the same parameters they were first used with."}}`)},
		{"PayPal/422 PAYPAL_REQUEST_ID_PREVIOUSLY_USED", idem.PayPalVault, body(422, `{"name":"UNPROCESSABLE_ENTITY","details":[{"issue":"PAYPAL_REQUEST_ID_PREVIOUSLY_USED"}]}`)},
		{"PayPal/409 DUPLICATE_REQUEST_ID", idem.PayPalPaymentsV1, body(409, `{"name":"DUPLICATE_REQUEST_ID","message":"The value of PayPal-Request-Id header has already been used."}`)},
		{"AmazonPay/409 DuplicateIdempotencyKey", idem.AmazonPay, body(409, `{"reasonCode":"DuplicateIdempotencyKey"}`)},
	}
	for _, tc := range reused {
		t.Run("key reused/"+tc.name, func(t *testing.T) {
			rt := &scriptRT{steps: []step{tc.ans, resp(200)}}
			c, store := newTestClient(rt, idem.WithProvider(tc.p), idem.WithBackoff(time.Millisecond, time.Millisecond))
			defer c.Close()
			r, err := post(t, context.Background(), c.HTTPClient(), `{"amount":1}`)
			require.NoError(t, err)
			r.Body.Close()
			assert.Equal(t, tc.ans.status, r.StatusCode)
			assert.Len(t, rt.sent, 1, "final: never sent again")
			op, err := store.Get(t.Context(), rt.sent[0].header.Get(tc.p.Header))
			require.NoError(t, err)
			assert.Equal(t, idem.StateFailed, op.State)
		})
	}
}
