package sdktest_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v82"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemtest"
)

// TestUnderStripeGo drives idem under stripe-go itself, which puts a fresh
// Idempotency-Key on every POST: a named operation keeps one key across
// retries, calls and a restart of the client, and the payment intent is
// created exactly once.
func TestUnderStripeGo(t *testing.T) {
	var created atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := created.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"pi_%d","object":"payment_intent","amount":4200,"currency":"eur","status":"requires_payment_method"}`, n)
	})
	// Attempt 1 is performed but its response lost; attempt 2 meets a 503.
	srv := idemtest.NewServer(h, idemtest.WithRetryAfter(0), idemtest.WithScript(func(key string, attempt int) idemtest.Fault {
		switch attempt {
		case 1:
			return idemtest.DropAfter
		case 2:
			return idemtest.Unavailable
		}
		return idemtest.NoFault
	}))
	defer srv.Close()

	store := idem.NewMemoryStore()
	newStripe := func() (*stripe.Client, *idem.Client) {
		c := idem.New(store, idem.WithBaseTransport(srv.Client().Transport), idem.WithBackoff(1, 1))
		sc := stripe.NewClient("sk_test_123", stripe.WithBackends(stripe.NewBackendsWithConfig(&stripe.BackendConfig{
			HTTPClient:        c.HTTPClient(),
			MaxNetworkRetries: stripe.Int64(0),
			URL:               stripe.String(srv.URL),
			EnableTelemetry:   stripe.Bool(false),
		})))
		return sc, c
	}
	params := func() *stripe.PaymentIntentCreateParams {
		return &stripe.PaymentIntentCreateParams{Amount: stripe.Int64(4200), Currency: stripe.String("eur")}
	}
	ctx := idem.WithOperation(context.Background(), "pay:order-42")

	sc, _ := newStripe()
	pi, err := sc.V1PaymentIntents.Create(ctx, params())
	require.NoError(t, err)
	assert.Equal(t, "pi_1", pi.ID)
	first := srv.Stats()
	require.Len(t, first.AttemptsByKey, 1, "every attempt carried one key")
	assert.Equal(t, 3, first.Requests)

	// "Restart": a new idem client and a new stripe client over the same journal.
	sc2, c2 := newStripe()
	defer c2.Close() // closes the shared store, after both clients are done
	pi, err = sc2.V1PaymentIntents.Create(ctx, params())
	require.NoError(t, err)
	assert.Equal(t, "pi_1", pi.ID, "the provider replayed the first result")
	st := srv.Stats()
	assert.Len(t, st.AttemptsByKey, 1, "the re-drive used the same key, not stripe-go's fresh one")
	assert.Equal(t, int64(1), created.Load(), "created exactly once")
	assert.Equal(t, 0, st.DuplicateKeys())
	assert.Equal(t, 2, st.Replays)
}

// TestStripeShouldRetryFalse checks that idem honours a server's
// "Stripe-Should-Retry: false" on a 500, which the wire table alone would
// retry: the request is sent once, not once per allowed attempt, and
// stripe-go, at its default of two retries, does not send it again either.
func TestStripeShouldRetryFalse(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Stripe-Should-Retry", "false")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprint(w, `{"error":{"type":"api_error","message":"the charge failed and must not be retried"}}`)
	})
	srv := idemtest.NewServer(h)
	defer srv.Close()

	c := idem.New(idem.NewMemoryStore(), idem.WithBaseTransport(srv.Client().Transport), idem.WithBackoff(1, 1))
	defer c.Close()
	sc := stripe.NewClient("sk_test_123", stripe.WithBackends(stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		HTTPClient:      c.HTTPClient(),
		URL:             stripe.String(srv.URL),
		EnableTelemetry: stripe.Bool(false),
		LeveledLogger:   &stripe.LeveledLogger{Level: stripe.LevelNull},
	})))

	_, err := sc.V1PaymentIntents.Create(context.Background(), &stripe.PaymentIntentCreateParams{
		Amount: stripe.Int64(4200), Currency: stripe.String("eur"),
	})
	var se *stripe.Error
	if assert.True(t, errors.As(err, &se), "want a *stripe.Error, got %v", err) {
		assert.Equal(t, http.StatusInternalServerError, se.HTTPStatusCode)
	}
	st := srv.Stats()
	assert.Equal(t, 1, st.Requests, "requests sent: Stripe-Should-Retry: false must stop idem's retries")
	assert.Equal(t, 1, st.Runs, "handler runs")
	assert.Len(t, st.AttemptsByKey, 1, "keys")
}
