package idemserver

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DefaultWebhookTolerance is how far a signed delivery's timestamp may be
// from the middleware's clock, either way, for StripeSignature and
// StandardWebhooks when they are given no tolerance of their own: five
// minutes, as Stripe's and Standard Webhooks' own libraries allow.
const DefaultWebhookTolerance = 5 * time.Minute

// ErrWebhookSignature is returned, wrapped, by the verifiers this package
// makes for a delivery whose signature is missing, malformed, does not
// verify, or whose timestamp is outside the tolerance.
var ErrWebhookSignature = errors.New("idemserver: webhook signature does not verify")

// ErrWebhookSecret is returned, wrapped, by a verifier made with a secret
// it cannot use (empty, or a Standard Webhooks secret that is not base64):
// no delivery verifies with it. The middleware logs it as an error.
var ErrWebhookSecret = errors.New("idemserver: webhook secret unusable")

// WebhookVerifier checks that a webhook delivery comes from its sender:
// it gets the request, its whole body and the middleware's clock, and
// returns nil for a delivery that verifies. It must not change the
// request or keep the body.
type WebhookVerifier func(r *http.Request, body []byte, now time.Time) error

// WithWebhookVerify makes the middleware's Webhook routes verify every
// delivery with v after reading its body and before its event id is read,
// looked up or recorded. A delivery that fails gets 401
// (ProblemUnauthorized), the handler does not run and nothing is stored,
// so a forged delivery carrying a real event id can neither block the real
// one (by leaving its own answer under the id) nor read the answer stored
// for it. StripeSignature and StandardWebhooks verify the common schemes.
//
// Without a verifier the event id alone counts: anyone who can reach the
// route and knows or guesses an event id gets the answer stored under it,
// and a forged delivery answered 2xx (or any answer, with
// WithWebhookClientErrors) is stored under the real event's id, so the
// real delivery is answered with it and never handled. Verify the
// signature in a handler in front of the middleware then, never inside
// it. A service with several senders makes one Middleware per sender, each
// with its verifier, over the same Store.
func WithWebhookVerify(v WebhookVerifier) Option {
	return func(c *config) { c.verify = v }
}

// StripeSignature returns a WebhookVerifier for Stripe's scheme: the
// Stripe-Signature header holds t=<unix seconds> and one or more
// v1=<hex HMAC-SHA256 with secret of "<t>.<body>">; the delivery verifies
// when one v1 matches and t is within tolerance of the clock
// (DefaultWebhookTolerance when tolerance is 0 or less). secret is the
// endpoint's signing secret ("whsec_...") as Stripe shows it; it is used
// as given.
func StripeSignature(secret string, tolerance time.Duration) WebhookVerifier {
	if tolerance <= 0 {
		tolerance = DefaultWebhookTolerance
	}
	key := []byte(secret)
	return func(r *http.Request, body []byte, now time.Time) error {
		if len(key) == 0 {
			return fmt.Errorf("%w: empty Stripe signing secret", ErrWebhookSecret)
		}
		h := r.Header.Get("Stripe-Signature")
		if h == "" {
			return fmt.Errorf("%w: no Stripe-Signature header", ErrWebhookSignature)
		}
		var ts string
		var sigs [][]byte
		for _, item := range strings.Split(h, ",") {
			k, v, _ := strings.Cut(strings.TrimSpace(item), "=")
			switch k {
			case "t":
				ts = v
			case "v1":
				if b, err := hex.DecodeString(v); err == nil {
					sigs = append(sigs, b)
				}
			}
		}
		if err := checkTimestamp(ts, now, tolerance); err != nil {
			return err
		}
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(ts))
		mac.Write([]byte{'.'})
		mac.Write(body)
		return anyEqual(mac.Sum(nil), sigs)
	}
}

// StandardWebhooks returns a WebhookVerifier for the Standard Webhooks
// scheme (standardwebhooks.com, which Svix implements): the webhook-id,
// webhook-timestamp (unix seconds) and webhook-signature headers (or
// svix-id, svix-timestamp and svix-signature, as Svix sends them), the
// last a space-separated list of "v1,<base64 HMAC-SHA256 of
// "<id>.<timestamp>.<body>">". The delivery verifies when one v1 signature
// matches and the timestamp is within tolerance of the clock
// (DefaultWebhookTolerance when tolerance is 0 or less). secret is the
// endpoint's secret as the sender shows it: "whsec_" then base64; the key
// is the decoded bytes.
func StandardWebhooks(secret string, tolerance time.Duration) WebhookVerifier {
	if tolerance <= 0 {
		tolerance = DefaultWebhookTolerance
	}
	key, keyErr := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if keyErr == nil && len(key) == 0 {
		keyErr = errors.New("empty")
	}
	return func(r *http.Request, body []byte, now time.Time) error {
		if keyErr != nil {
			return fmt.Errorf("%w: Standard Webhooks secret is not whsec_ and base64: %v", ErrWebhookSecret, keyErr)
		}
		id, ts, sig := r.Header.Get("Webhook-Id"), r.Header.Get("Webhook-Timestamp"), r.Header.Get("Webhook-Signature")
		if id == "" && ts == "" && sig == "" {
			id, ts, sig = r.Header.Get("Svix-Id"), r.Header.Get("Svix-Timestamp"), r.Header.Get("Svix-Signature")
		}
		if id == "" || sig == "" {
			return fmt.Errorf("%w: no webhook-id or webhook-signature header", ErrWebhookSignature)
		}
		if err := checkTimestamp(ts, now, tolerance); err != nil {
			return err
		}
		var sigs [][]byte
		for _, s := range strings.Fields(sig) {
			if v, b64, ok := strings.Cut(s, ","); ok && v == "v1" {
				if b, err := base64.StdEncoding.DecodeString(b64); err == nil {
					sigs = append(sigs, b)
				}
			}
		}
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(id))
		mac.Write([]byte{'.'})
		mac.Write([]byte(ts))
		mac.Write([]byte{'.'})
		mac.Write(body)
		return anyEqual(mac.Sum(nil), sigs)
	}
}

// checkTimestamp checks that ts, unix seconds, is within tolerance of now.
func checkTimestamp(ts string, now time.Time, tolerance time.Duration) error {
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: no valid timestamp", ErrWebhookSignature)
	}
	d := now.Sub(time.Unix(sec, 0))
	if d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: timestamp %d is %v away from the clock, more than the tolerance of %v", ErrWebhookSignature, sec, d.Round(time.Second), tolerance)
	}
	return nil
}

// anyEqual returns nil if one of sigs equals want, compared in constant
// time.
func anyEqual(want []byte, sigs [][]byte) error {
	for _, s := range sigs {
		if hmac.Equal(want, s) {
			return nil
		}
	}
	if len(sigs) == 0 {
		return fmt.Errorf("%w: no v1 signature", ErrWebhookSignature)
	}
	return fmt.Errorf("%w: no v1 signature matches", ErrWebhookSignature)
}

// verifyDelivery runs the middleware's webhook verifier, if it has one,
// and answers 401 for a delivery that fails it; it reports whether the
// delivery may go on.
func (m *Middleware) verifyDelivery(w http.ResponseWriter, r *http.Request, body []byte) bool {
	if m.cfg.verify == nil {
		return true
	}
	err := m.cfg.verify(r, body, m.now())
	if err == nil {
		return true
	}
	if errors.Is(err, ErrWebhookSecret) {
		m.cfg.logger.Error("idemserver: webhook verifier cannot verify any delivery", "err", err)
	} else {
		m.cfg.logger.Debug("idemserver: webhook delivery refused", "err", err)
	}
	writeProblem(w, http.StatusUnauthorized, ProblemUnauthorized, "Unauthorized",
		"The delivery's signature does not verify.", 0)
	return false
}
