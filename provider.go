package idem

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Provider describes how one API honours idempotency keys: where the key
// travels, what a key may look like, how long the API remembers it, and
// how its answers say "in progress", "key reused" and "replayed". It is
// plain data: use one of the package's profiles (Stripe, PayPal, Adyen,
// CheckoutCom, Worldline, AmazonPay), copy and adjust one, or build your
// own, and give it to WithProvider.
//
// The zero value is a provider that takes idem's defaults everywhere:
// the Idempotency-Key header, keys of 1 to 255 visible ASCII bytes, an
// unknown retention (idem's default resend window stays), no codes of its
// own.
//
// A provider whose key travels in the request body rather than a header,
// such as Square (an idempotency_key member in the JSON body of each
// create call, https://developer.squareup.com/docs/working-with-apis/idempotency,
// retention not published, IDEMPOTENCY_KEY_REUSED for another payload), is
// out of reach of a transport: idem cannot put a key into a body without
// changing the payload it fingerprints, and retries with a fresh key from
// an SDK would be new payments. For such an API, put your own stable key in
// the body (one per business action, stored before the first attempt, for
// example the name you would give WithOperation), and send the request
// through idem with WithOperation or WithKey carrying that same key: idem
// then journals the request and resends it byte for byte with the key the
// body already holds (the key header it adds is ignored by Square).
type Provider struct {
	// Name names the provider in errors and logs.
	Name string
	// Header is the request header that carries the key. Empty means
	// DefaultHeader.
	Header string
	// KeyMaxLen is the longest key the provider accepts. Zero means 255,
	// idem's own limit, which is also the most it ever allows.
	KeyMaxLen int
	// KeyChars lists every byte a key may contain. Empty means any visible
	// ASCII byte (0x21 to 0x7e).
	KeyChars string
	// Retention is how long the provider remembers a key after its first
	// use. Zero means not published, or indefinite: idem's own resend
	// window stays. Otherwise WithProvider keeps the resend window below it
	// with a margin (see WithProvider).
	Retention time.Duration
	// RetryHints are response headers whose value "true" or "false" says
	// whether the request may be retried (Stripe-Should-Retry). They win
	// over the status, as idem's built-in Stripe-Should-Retry and
	// X-Should-Retry do.
	RetryHints []string
	// InProgressCodes are error codes in a 4xx answer's body meaning "a
	// request with this key is still being processed": retry later with the
	// same key.
	InProgressCodes []string
	// KeyReusedCodes are error codes in a 4xx answer's body meaning "this
	// key was used for another request": permanent, never retried.
	KeyReusedCodes []string
	// ReplayHeaders are response headers present on a replayed answer
	// (any value but "false"), not on the first one.
	ReplayHeaders []string
	// ReplayStatus, if not zero, is the status a replay carries instead of
	// the original's.
	ReplayStatus int
	// KeepsErrors reports whether the provider stores and replays non-2xx
	// answers too. When false, a retry after a 4xx or 5xx is performed
	// anew: a replayed error never comes back.
	KeepsErrors bool
	// Source is where the facts above come from (documentation URLs), and
	// Checked when they were last read there. Unverified lists the facts
	// that the source did not confirm.
	Source, Checked, Unverified string
}

// Profiles of providers, as their public documentation described them when
// Checked. Providers change their rules: check Source before relying on a
// limit. To adjust one, copy it (p := idem.PayPal; p.Retention = 72 *
// time.Hour) rather than change the package's value.
var (
	// Stripe is Stripe's API v1: Idempotency-Key, up to 255 characters,
	// keys pruned once they are at least 24 hours old, results stored
	// whether they succeed or fail (500s included), 409
	// idempotency_key_in_use for a request still running,
	// idempotency_error for a key reused with other parameters, replays
	// marked Idempotent-Replayed: true, Stripe-Should-Retry as a hint.
	//
	// Source: https://docs.stripe.com/api/idempotent_requests and
	// https://docs.stripe.com/idempotency, read late 2026. Unverified: the
	// alphabet of keys (any visible ASCII is assumed).
	Stripe = Provider{
		Name: "Stripe", Header: "Idempotency-Key", KeyMaxLen: 255,
		Retention: 24 * time.Hour, RetryHints: []string{"Stripe-Should-Retry"},
		InProgressCodes: []string{"idempotency_key_in_use"}, KeyReusedCodes: []string{"idempotency_error"},
		ReplayHeaders: []string{"Idempotent-Replayed"}, KeepsErrors: true,
		Source:     "https://docs.stripe.com/api/idempotent_requests https://docs.stripe.com/idempotency",
		Checked:    "2026-12",
		Unverified: "key alphabet",
	}

	// PayPal is PayPal's REST APIs (Orders v2): PayPal-Request-Id, up to
	// 108 characters, kept 6 hours for Orders v2 (up to 72 hours on
	// request to PayPal), the latest status of the first request returned
	// for a reused key whatever the payload, two simultaneous requests:
	// PayPal "might fail the second", no replay marker. With this profile
	// idem's resend window is 5 hours.
	//
	// Source: https://developer.paypal.com/api/rest/reference/idempotency/
	// and the Orders v2 reference
	// (https://developer.paypal.com/docs/api/orders/v2/), read late 2026.
	// Unverified: the key alphabet, the answer to a concurrent request, and
	// whether failed requests are kept.
	PayPal = Provider{
		Name: "PayPal", Header: "PayPal-Request-Id", KeyMaxLen: 108,
		Retention:  6 * time.Hour,
		Source:     "https://developer.paypal.com/api/rest/reference/idempotency/ https://developer.paypal.com/docs/api/orders/v2/",
		Checked:    "2026-12",
		Unverified: "key alphabet; answer to a concurrent request; whether errors are kept",
	}

	// Adyen is Adyen's APIs: Idempotency-Key, up to 64 characters, kept at
	// least 31 days per company account (a key is not shared across
	// regional live endpoints), the key echoed in the answer.
	//
	// Source: https://docs.adyen.com/development-resources/api-idempotency,
	// read late 2026. Unverified: the key alphabet, the answers to a
	// concurrent request and to another payload (no codes are taught), and
	// whether errors are kept.
	Adyen = Provider{
		Name: "Adyen", Header: "Idempotency-Key", KeyMaxLen: 64,
		Retention:  31 * 24 * time.Hour,
		Source:     "https://docs.adyen.com/development-resources/api-idempotency",
		Checked:    "2026-12",
		Unverified: "key alphabet; concurrent and other-payload answers; whether errors are kept",
	}

	// CheckoutCom is Checkout.com's API: Cko-Idempotency-Key, keys kept
	// 24 hours (production and sandbox; longer on request), only 2xx
	// results kept (after a 4xx or 5xx the payment is attempted again), 409
	// for a request still running (older documentation said 429), and a
	// replay answered 202 with the original response body.
	//
	// Source: https://www.checkout.com/docs/payments/manage-payments/idempotency
	// and https://support.checkout.com/hc/en-us/articles/26763450855186,
	// read late 2026. Unverified: the longest key (not published; 255
	// assumed), the key alphabet, the answer to another payload.
	CheckoutCom = Provider{
		Name: "Checkout.com", Header: "Cko-Idempotency-Key",
		Retention: 24 * time.Hour, ReplayStatus: http.StatusAccepted,
		Source:     "https://www.checkout.com/docs/payments/manage-payments/idempotency https://support.checkout.com/hc/en-us/articles/26763450855186",
		Checked:    "2026-12",
		Unverified: "longest key; key alphabet; other-payload answer",
	}

	// Worldline is Worldline Direct: X-GCS-Idempotence-Key, up to 40 ASCII
	// characters, kept at least 24 hours, 409 while the first request runs,
	// the original outcome returned even for another payload, and replays
	// marked with X-GCS-Idempotence-Request-Timestamp (the first request's
	// arrival in milliseconds).
	//
	// Source: https://docs.direct.worldline-solutions.com/integration/api-developer-guide/idempotent-requests
	// (the header names as the Worldline Connect reference gives them:
	// https://apireference.connect.worldline-solutions.com/s2sapi/v1/en_US/go/idempotent-requests.html),
	// read late 2026. Unverified: that Direct uses Connect's header names
	// (the Direct page we read cut off before naming them), whether errors
	// are kept.
	Worldline = Provider{
		Name: "Worldline", Header: "X-GCS-Idempotence-Key", KeyMaxLen: 40,
		Retention:     24 * time.Hour,
		ReplayHeaders: []string{"X-GCS-Idempotence-Request-Timestamp"},
		Source:        "https://docs.direct.worldline-solutions.com/integration/api-developer-guide/idempotent-requests https://apireference.connect.worldline-solutions.com/s2sapi/v1/en_US/go/idempotent-requests.html",
		Checked:       "2026-12",
		Unverified:    "header names on Direct; whether errors are kept",
	}

	// AmazonPay is Amazon Pay API v2: x-amz-pay-idempotency-key, up to 32
	// characters of [A-Za-z0-9_-], kept indefinitely per merchant account,
	// the saved result replayed, DuplicateIdempotencyKey for a key reused
	// with other values. A UUID (36 characters) does not fit: idem sends
	// the UUIDv7's 32 hex digits without dashes.
	//
	// Source: https://developer.amazon.com/docs/amazon-pay-api-v2/idempotency.html,
	// read late 2026. Unverified: the status that carries
	// DuplicateIdempotencyKey, the answer to a concurrent request.
	AmazonPay = Provider{
		Name: "Amazon Pay", Header: "x-amz-pay-idempotency-key", KeyMaxLen: 32,
		KeyChars:       "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-",
		KeyReusedCodes: []string{"DuplicateIdempotencyKey"}, KeepsErrors: true,
		Source:     "https://developer.amazon.com/docs/amazon-pay-api-v2/idempotency.html",
		Checked:    "2026-12",
		Unverified: "status of DuplicateIdempotencyKey; concurrent answer",
	}
)

// WithProvider makes the Client speak p's dialect:
//
//   - the key travels in p.Header;
//   - new keys fit p's format: a UUIDv7 as usual (36 characters), or its
//     32 hex digits without dashes where 36 characters or a dash do not
//     fit; both keep the UUIDv7's time order. A key of the caller's own
//     (WithKey, a header) that does not fit is refused before anything is
//     sent, with an error matching ErrInvalidKey;
//   - the resend window stays below p.Retention by a margin of an hour
//     (a sixth of the retention when that is shorter), whatever
//     WithResendWindow says: past the provider's retention a resend would
//     be a second charge. PayPal's 6 hours give a window of 5 hours;
//   - p's retry hints and error codes teach the classifier when to retry.
//
// A later WithKeyHeader still changes the header. The zero Provider changes
// nothing.
func WithProvider(p Provider) Option {
	// The profile's slices are copied: a change to the package's profile
	// after this call does not reach the Client.
	p.RetryHints, p.InProgressCodes = slices.Clone(p.RetryHints), slices.Clone(p.InProgressCodes)
	p.KeyReusedCodes, p.ReplayHeaders = slices.Clone(p.KeyReusedCodes), slices.Clone(p.ReplayHeaders)
	return func(c *config) {
		c.provider = &p
		if p.Header != "" {
			c.header = http.CanonicalHeaderKey(p.Header)
		}
	}
}

// applyProvider bounds the resend window by the provider's retention,
// after every option has run.
func (c *config) applyProvider() {
	if c.provider == nil || c.provider.Retention <= 0 {
		return
	}
	if w := c.provider.Window(); w < c.resendWindow {
		c.resendWindow = w
	}
}

// Window returns the longest resend window that stays safely below p's
// retention: the retention less an hour, or less a sixth of it when that
// is shorter. It is zero when the retention is unknown.
func (p Provider) Window() time.Duration {
	if p.Retention <= 0 {
		return 0
	}
	return p.Retention - min(time.Hour, p.Retention/6)
}

// maxLen returns the longest key p accepts.
func (p Provider) maxLen() int {
	if p.KeyMaxLen <= 0 || p.KeyMaxLen > maxKeyLen {
		return maxKeyLen
	}
	return p.KeyMaxLen
}

// CheckKey returns an error matching ErrInvalidKey unless key is a key p
// accepts (and idem can journal).
func (p Provider) CheckKey(key string) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	if n := p.maxLen(); len(key) > n {
		return fmt.Errorf("%w: key %s is %d bytes, %s accepts at most %d", ErrInvalidKey, quote(key), len(key), p.name(), n)
	}
	if p.KeyChars != "" {
		for i := 0; i < len(key); i++ {
			if strings.IndexByte(p.KeyChars, key[i]) < 0 {
				return fmt.Errorf("%w: key %s has %q, which %s does not accept", ErrInvalidKey, quote(key), key[i], p.name())
			}
		}
	}
	return nil
}

// NewKey returns a new random key in p's format: a UUIDv7, or its 32 hex
// digits when the UUID's 36 characters do not fit. It fails if neither
// fits.
func (p Provider) NewKey() (string, error) {
	u, err := uuid.NewV7()
	if err != nil {
		return "", fmt.Errorf("generating key: %w", err)
	}
	if s := u.String(); p.CheckKey(s) == nil {
		return s, nil
	}
	if s := hex.EncodeToString(u[:]); p.CheckKey(s) == nil {
		return s, nil
	}
	return "", fmt.Errorf("%w: %s's key format (at most %d of %q) fits no UUIDv7 form", ErrInvalidKey, p.name(), p.maxLen(), p.KeyChars)
}

// Replayed reports whether resp is marked as a replay by one of p's
// replay headers, or by idem's defaults (Idempotent-Replayed,
// Idempotency-Replayed, X-Idempotent-Replayed: true) when p names none.
func (p Provider) Replayed(resp *http.Response) bool {
	if resp == nil {
		return false
	}
	if len(p.ReplayHeaders) == 0 {
		for _, h := range [...]string{"Idempotent-Replayed", "Idempotency-Replayed", "X-Idempotent-Replayed"} {
			if strings.EqualFold(strings.TrimSpace(resp.Header.Get(h)), "true") {
				return true
			}
		}
		return false
	}
	for _, h := range p.ReplayHeaders {
		if v := strings.TrimSpace(resp.Header.Get(h)); v != "" && !strings.EqualFold(v, "false") {
			return true
		}
	}
	return false
}

func (p Provider) name() string {
	if p.Name == "" {
		return "the provider"
	}
	return p.Name
}

// newKey returns a new key for a request: a UUIDv7, shaped to the
// provider's format if there is one.
func (c *config) newKey() (string, error) {
	if c.provider == nil {
		return newKey()
	}
	return c.provider.NewKey()
}

// checkKey checks a caller's key against idem's limits and the provider's
// format.
func (c *config) checkKey(k string) error {
	if err := validKey(k); err != nil {
		return err
	}
	if c.provider != nil {
		return c.provider.CheckKey(k)
	}
	return nil
}

// classify is classifyResponse taught the provider's retry hints and
// codes.
func (c *config) classify(resp *http.Response) (verdict, string) {
	if c.provider != nil {
		if v, reason, ok := c.provider.classify(resp); ok {
			return v, reason
		}
	}
	return classifyResponse(resp)
}

// classify reads p's retry hints on any failed answer, and p's codes in a
// 4xx body's first bytes (peekBody: bounded in bytes and time, put back
// for the caller). It reports false when p says nothing about resp.
func (p *Provider) classify(resp *http.Response) (verdict, string, bool) {
	code := resp.StatusCode
	if code < 400 {
		return 0, "", false
	}
	for _, h := range p.RetryHints {
		switch strings.ToLower(strings.TrimSpace(resp.Header.Get(h))) {
		case "true":
			return transient, strconv.Itoa(code) + " " + http.CanonicalHeaderKey(h) + ": true", true
		case "false":
			return permanent, strconv.Itoa(code) + " " + http.CanonicalHeaderKey(h) + ": false", true
		}
	}
	if code >= 500 || len(p.InProgressCodes)+len(p.KeyReusedCodes) == 0 || resp.Body == nil || resp.Body == http.NoBody {
		return 0, "", false
	}
	peek, pb := peekBody(resp)
	if pb == nil {
		return 0, "", false
	}
	// A code is matched as a whole JSON string, wherever the provider puts
	// it (code, type, error.code, errors[].code, reasonCode, ...).
	for _, k := range p.KeyReusedCodes {
		if bytes.Contains(peek, []byte(`"`+k+`"`)) {
			return permanent, strconv.Itoa(code) + " key reused (" + k + ")", true
		}
	}
	for _, k := range p.InProgressCodes {
		if bytes.Contains(peek, []byte(`"`+k+`"`)) {
			return transient, strconv.Itoa(code) + " in progress (" + k + ")", true
		}
	}
	return 0, "", false
}
