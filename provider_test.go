package idem_test

import (
	"context"
	"errors"
	"io"

	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

var profiles = map[string]idem.Provider{
	"Stripe": idem.Stripe, "PayPal": idem.PayPal, "Adyen": idem.Adyen,
	"CheckoutCom": idem.CheckoutCom, "Worldline": idem.Worldline, "AmazonPay": idem.AmazonPay,
	"StripeV2": idem.StripeV2, "GoCardless": idem.GoCardless, "PayPalOrders": idem.PayPalOrders,
	"PayPalVault": idem.PayPalVault, "PayPalSubscriptions": idem.PayPalSubscriptions,
	"PayPalPaymentsV1": idem.PayPalPaymentsV1, "PayPalPaymentsV2": idem.PayPalPaymentsV2,
	// idem.Square's key travels in the body: TestSquareKeyInTheBody.
}

// TestProviderProfilesSendTheirHeaderAndKeys sends two payments under each
// profile and checks the header and the keys' format and order.
func TestProviderProfilesSendTheirHeaderAndKeys(t *testing.T) {
	for name, p := range profiles {
		t.Run(name, func(t *testing.T) {
			require.NotEmpty(t, p.Source, "a profile cites its source")
			require.NotEmpty(t, p.Checked, "a profile says when it was read")
			rt := &scriptRT{steps: []step{resp(201)}}
			c := idem.New(idem.NewMemoryStore(), idem.WithProvider(p), idem.WithBaseTransport(rt))
			defer c.Close()
			for _, body := range []string{`{"amount":1}`, `{"amount":2}`} {
				r, err := post(t, context.Background(), c.HTTPClient(), body)
				require.NoError(t, err)
				r.Body.Close()
			}
			require.Len(t, rt.sent, 2)
			var keys []string
			for _, s := range rt.sent {
				k := s.header.Get(p.Header)
				require.NotEmpty(t, k, "the key travels in %s", p.Header)
				if !strings.EqualFold(p.Header, idem.DefaultHeader) {
					assert.Empty(t, s.header.Get(idem.DefaultHeader), "no key in the default header")
				}
				assert.NoError(t, p.CheckKey(k))
				if p.KeyMaxLen > 0 {
					assert.LessOrEqual(t, len(k), p.KeyMaxLen)
				}
				for i := 0; p.KeyChars != "" && i < len(k); i++ {
					assert.Contains(t, p.KeyChars, string(k[i]), "key %s", k)
				}
				keys = append(keys, k)
			}
			assert.NotEqual(t, keys[0], keys[1])
			assert.True(t, slices.IsSorted(keys), "keys keep the UUIDv7's time order: %v", keys)
		})
	}
}

// TestAmazonPayKeysAreUUIDv7HexDigits checks the form of a key where a
// dashed UUID does not fit.
func TestAmazonPayKeysAreUUIDv7HexDigits(t *testing.T) {
	k, err := idem.AmazonPay.NewKey()
	require.NoError(t, err)
	assert.Regexp(t, `^[0-9a-f]{12}7[0-9a-f]{19}$`, k, "32 hex digits of a version 7 UUID")
	k, err = idem.Worldline.NewKey()
	require.NoError(t, err)
	assert.Len(t, k, 36, "a dashed UUID fits Worldline's 40 characters")

	_, err = idem.Provider{Name: "Tiny", KeyMaxLen: 20}.NewKey()
	assert.ErrorIs(t, err, idem.ErrInvalidKey, "no UUIDv7 form fits 20 characters")
}

// TestProviderRefusesCallersKeyOfWrongFormat sends a 43-character key to
// Worldline (which accepts 40) and a key with a dot to Amazon Pay: both are
// refused before anything is sent.
func TestProviderRefusesCallersKeyOfWrongFormat(t *testing.T) {
	for _, tc := range []struct {
		p   idem.Provider
		key string
	}{
		{idem.Worldline, strings.Repeat("k", 43)},
		{idem.AmazonPay, "order.42"},
	} {
		t.Run(tc.p.Name, func(t *testing.T) {
			rt := &scriptRT{steps: []step{resp(201)}}
			c := idem.New(idem.NewMemoryStore(), idem.WithProvider(tc.p), idem.WithBaseTransport(rt))
			defer c.Close()
			r, err := post(t, idem.WithKey(context.Background(), tc.key), c.HTTPClient(), `{"amount":1}`)
			if r != nil {
				r.Body.Close()
			}
			require.ErrorIs(t, err, idem.ErrInvalidKey)
			assert.Equal(t, 1, strings.Count(err.Error(), "invalid idempotency key"), "the cause said once: %v", err)
			assert.Empty(t, rt.sent, "nothing was sent")
		})
	}
}

// TestPayPalOperationNotResentAfterWindow leaves a payment in doubt and
// resumes it after 4 and after 5½ hours under the PayPalOrders profile,
// which keeps keys 6 hours: the first is resent with its key, the second
// is expired and nothing is sent. Without the profile (or with a longer
// WithResendWindow after it) idem's 23 hours would resend it after PayPal
// forgot the key; the control checks that it does without the profile.
// The PayPal profile, for any PayPal API, is safe for the vault's 3 hours:
// a resend after 2 hours goes, one after 4 hours (a new request to the
// vault) does not.
func TestPayPalOperationNotResentAfterWindow(t *testing.T) {
	for _, tc := range []struct {
		name   string
		opts   []idem.Option
		after  time.Duration
		resent bool
	}{
		{"PayPalOrders/4h", []idem.Option{idem.WithProvider(idem.PayPalOrders)}, 4 * time.Hour, true},
		{"PayPalOrders/5h30m", []idem.Option{idem.WithProvider(idem.PayPalOrders)}, 5*time.Hour + 30*time.Minute, false},
		{"PayPalOrders+WithResendWindow(23h)/5h30m", []idem.Option{idem.WithProvider(idem.PayPalOrders), idem.WithResendWindow(23 * time.Hour)}, 5*time.Hour + 30*time.Minute, false},
		{"PayPal/2h", []idem.Option{idem.WithProvider(idem.PayPal)}, 2 * time.Hour, true},
		{"PayPal/4h", []idem.Option{idem.WithProvider(idem.PayPal)}, 4 * time.Hour, false},
		{"PayPalVault/4h", []idem.Option{idem.WithProvider(idem.PayPalVault)}, 4 * time.Hour, false},
		{"no profile/5h30m", []idem.Option{idem.WithKeyHeader("PayPal-Request-Id")}, 5*time.Hour + 30*time.Minute, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt := &scriptRT{steps: []step{fail(errReset), resp(201)}}
				opts := append([]idem.Option{idem.WithBaseTransport(rt), idem.WithMaxAttempts(1)}, tc.opts...)
				c := idem.New(idem.NewMemoryStore(), opts...)
				defer c.Close()
				_, err := post(t, context.Background(), c.HTTPClient(), `{"amount":1}`)
				var ie *idem.Error
				require.ErrorAs(t, err, &ie)
				require.Equal(t, idem.StatePending, ie.State, "the payment is in doubt")
				require.Len(t, rt.sent, 1)

				time.Sleep(tc.after)
				var got error
				require.NoError(t, c.Resume(context.Background(), func(op idem.Operation, r *http.Response, err error) {
					got = err
					if r != nil {
						r.Body.Close()
					}
				}))
				if tc.resent {
					require.NoError(t, got)
					require.Len(t, rt.sent, 2, "resent")
					assert.Equal(t, rt.sent[0].header.Get("PayPal-Request-Id"), rt.sent[1].header.Get("PayPal-Request-Id"), "with its key")
					return
				}
				assert.ErrorIs(t, got, idem.ErrExpired)
				assert.Len(t, rt.sent, 1, "nothing was sent after PayPal's window")
			})
		})
	}
}

// TestProviderTeachesClassifier checks that a provider's codes and hints
// change what idem retries: Amazon Pay's DuplicateIdempotencyKey on a 409
// (which idem reads as "in progress" by default) is final, a custom
// in-progress code on a 400 is retried, and a custom hint header wins.
func TestProviderTeachesClassifier(t *testing.T) {
	acme := idem.Provider{Name: "Acme", InProgressCodes: []string{"STILL_RUNNING"}, RetryHints: []string{"Acme-Retry"}}
	for _, tc := range []struct {
		name  string
		opts  []idem.Option
		first step
		sent  int
	}{
		{"default/409 DuplicateIdempotencyKey", nil, body(409, `{"reasonCode":"DuplicateIdempotencyKey"}`), 2},
		{"AmazonPay/409 DuplicateIdempotencyKey", []idem.Option{idem.WithProvider(idem.AmazonPay)}, body(409, `{"reasonCode":"DuplicateIdempotencyKey"}`), 1},
		{"default/400 STILL_RUNNING", nil, body(400, `{"errors":[{"code":"STILL_RUNNING"}]}`), 1},
		{"Acme/400 STILL_RUNNING", []idem.Option{idem.WithProvider(acme)}, body(400, `{"errors":[{"code":"STILL_RUNNING"}]}`), 2},
		{"Acme/400 Acme-Retry: true", []idem.Option{idem.WithProvider(acme)}, withHeader(body(400, `{}`), "Acme-Retry", "true"), 2},
		{"Acme/503 Acme-Retry: false", []idem.Option{idem.WithProvider(acme)}, withHeader(body(503, `{}`), "Acme-Retry", "false"), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := &scriptRT{steps: []step{tc.first, resp(201)}}
			opts := append([]idem.Option{idem.WithBaseTransport(rt), idem.WithBackoff(time.Millisecond, time.Millisecond), idem.WithMaxAttempts(2)}, tc.opts...)
			c := idem.New(idem.NewMemoryStore(), opts...)
			defer c.Close()
			r, err := post(t, context.Background(), c.HTTPClient(), `{"amount":1}`)
			require.NoError(t, err)
			r.Body.Close()
			assert.Len(t, rt.sent, tc.sent)
			if tc.sent == 1 {
				assert.Equal(t, tc.first.status, r.StatusCode, "the answer is returned as it is")
			}
		})
	}
}

// TestProviderReplayed reads each profile's replay marker.
func TestProviderReplayed(t *testing.T) {
	r := &http.Response{StatusCode: 200, Header: http.Header{}}
	assert.False(t, idem.Stripe.Replayed(r))
	r.Header.Set("Idempotent-Replayed", "true")
	assert.True(t, idem.Stripe.Replayed(r))
	assert.True(t, idem.Provider{}.Replayed(r), "idem's default markers")
	assert.False(t, idem.Worldline.Replayed(r), "Worldline marks replays its own way")
	r.Header.Set("X-GCS-Idempotence-Request-Timestamp", "1764582000000")
	assert.True(t, idem.Worldline.Replayed(r))
	assert.False(t, idem.Provider{}.Replayed(nil))
}

// TestProviderWindow checks the margin below each retention.
func TestProviderWindow(t *testing.T) {
	assert.Equal(t, 2*time.Hour+30*time.Minute, idem.PayPal.Window(), "safe for the vault's 3 hours")
	assert.Equal(t, 2*time.Hour+30*time.Minute, idem.PayPalVault.Window())
	assert.Equal(t, 5*time.Hour, idem.PayPalOrders.Window())
	assert.Equal(t, 71*time.Hour, idem.PayPalSubscriptions.Window())
	assert.Equal(t, 30*24*time.Hour-time.Hour, idem.PayPalPaymentsV1.Window())
	assert.Equal(t, 45*24*time.Hour-time.Hour, idem.PayPalPaymentsV2.Window())
	assert.Equal(t, 7*24*time.Hour-time.Hour, idem.Adyen.Window(), "Adyen's current page: 7 to 14 days")
	assert.Equal(t, 30*24*time.Hour-time.Hour, idem.StripeV2.Window())
	assert.Equal(t, 23*time.Hour, idem.Stripe.Window())
	assert.Equal(t, 25*time.Minute, idem.Provider{Retention: 30 * time.Minute}.Window())
	assert.Zero(t, idem.AmazonPay.Window(), "indefinite: idem's own window stays")
}

func body(status int, b string) step {
	return step{status: status, header: http.Header{"Content-Type": {"application/json"}}, body: b}
}

func withHeader(s step, k, v string) step {
	s.header = s.header.Clone()
	s.header.Set(k, v)
	return s
}

// TestProviderKeyAfterASettledMatch makes a call that was matched to an
// earlier call in doubt find that call settled while it waited, so that it
// needs a key of its own: that key must fit the provider's format too
// (Amazon Pay: 32 of [A-Za-z0-9_-]), as every other key idem makes does.
func TestProviderKeyAfterASettledMatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			mu    sync.Mutex
			keys  []string
			calls int
		)
		second := make(chan struct{}) // closed when the matched resend is on the wire
		release := make(chan struct{})
		rt := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			mu.Lock()
			calls++
			n := calls
			keys = append(keys, r.Header.Get(idem.AmazonPay.Header))
			mu.Unlock()
			switch n {
			case 1:
				return nil, errors.New("connection reset by peer") // in doubt
			case 2:
				close(second)
				<-release
			}
			return &http.Response{StatusCode: 201, Body: io.NopCloser(strings.NewReader("{}")), Header: http.Header{}, Request: r}, nil
		})
		c := idem.New(idem.NewMemoryStore(), idem.WithProvider(idem.AmazonPay), idem.WithBaseTransport(rt), idem.WithMaxAttempts(1))
		defer c.Close()
		ctx := context.Background()
		if r, err := post(t, ctx, c.HTTPClient(), `{"amount":1}`); err == nil {
			r.Body.Close()
		}
		done := make(chan struct{})
		go func() { // the SDK's resend: matched to the first call's key
			defer close(done)
			if r, err := post(t, ctx, c.HTTPClient(), `{"amount":1}`); err == nil {
				io.Copy(io.Discard, r.Body)
				r.Body.Close()
			}
		}()
		<-second
		third := make(chan struct{})
		go func() { // another resend, matched too, waits for the second
			defer close(third)
			if r, err := post(t, ctx, c.HTTPClient(), `{"amount":1}`); err == nil {
				io.Copy(io.Discard, r.Body)
				r.Body.Close()
			}
		}()
		synctest.Wait() // the third call waits for the second
		close(release)
		<-done
		<-third
		mu.Lock()
		defer mu.Unlock()
		require.NotEmpty(t, keys)
		for _, k := range keys {
			assert.NoError(t, idem.AmazonPay.CheckKey(k), "every key sent fits the provider: %q", k)
		}
	})
}
