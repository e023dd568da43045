package idem

import (
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Provider describes how one API honours idempotency keys: where the key
// travels, what a key may look like, how long the API remembers it, which
// methods it keys, and how its answers say "in progress", "key reused",
// "performed, answer not kept" and "replayed". It is plain data: use one
// of the package's profiles (Stripe, StripeV2, PayPal and its per-API
// profiles, Adyen, GoCardless, CheckoutCom, Worldline, AmazonPay), copy
// and adjust one, or build your own, and give it to WithProvider.
//
// The zero value is a provider that takes idem's defaults everywhere:
// the Idempotency-Key header, keys of 1 to 255 visible ASCII bytes, an
// unknown retention (idem's default resend window stays), POST and PATCH
// keyed, no codes of its own.
//
// A provider whose key travels in a JSON body member rather than a
// header, such as Square's idempotency_key, is described by BodyKeyField:
// idem writes the key into the body before it journals and sends it. One
// whose key travels inside a GraphQL mutation answered with 200 whatever
// happened (Braintree's GraphQL API) stays out of reach of a transport:
// the key is one argument among others, and the answer's status says
// nothing; journal such calls through your own code.
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
	// BodyKeyField, if not empty, names the top-level member of the JSON
	// object body that carries the key (Square's idempotency_key): idem
	// writes the key there before the request is journaled and first sent,
	// so the journaled body, every attempt and every resend carry it, and
	// fingerprints the body without it (a re-drive with the same payload
	// matches). A body that holds the member already keeps it: its value
	// is the request's key, as a key on the header would be (WithKey or
	// WithOperation must then agree with it). A keyed request whose body
	// is not a JSON object, or is too large to journal, is refused with
	// ErrInvalidRequest. The key header is sent too.
	BodyKeyField string
	// Retention is how long the provider remembers a key after its first
	// use. Zero means not published, or indefinite: idem's own resend
	// window stays. Otherwise WithProvider keeps the resend window below it
	// with a margin (see WithProvider).
	Retention time.Duration
	// Methods are the methods whose requests the provider keys, and so
	// the ones idem journals and sends with a key (WithKeyedMethods).
	// Empty means idem's default, POST and PATCH.
	Methods []string
	// RetryHints are response headers whose value "true" or "false" says
	// whether the request may be retried (Stripe-Should-Retry, Adyen's
	// transient-error). They win over the status, as idem's built-in
	// Stripe-Should-Retry and X-Should-Retry do. A "true" on a 4xx that
	// also carries one of InProgressCodes is read as "in progress".
	RetryHints []string
	// InProgressCodes are error codes in a 4xx answer's body meaning "a
	// request with this key is still being processed": retry later with the
	// same key. When attempts run out on such an answer, it is returned and
	// the operation stays pending (in doubt), never failed.
	InProgressCodes []string
	// KeyReusedCodes are error codes in a 4xx answer's body meaning "this
	// key was used for another request": permanent, never retried.
	KeyReusedCodes []string
	// PerformedCodes are error codes in a 4xx answer's body meaning "a
	// request under this key was performed, and its answer is not
	// replayed" (GoCardless's idempotent_creation_conflict). Such an answer
	// is returned as it is, marked with PerformedHeader; nothing is sent
	// again, and the journal records the operation as performed
	// (StateSucceeded when the answer names the resource made, see
	// ResourceField), never pending, never failed.
	PerformedCodes []string
	// ResourceField is the JSON member of a performed answer that names
	// the resource the first request made (GoCardless's
	// conflicting_resource_id), or "". idem records it in the journal and
	// in PerformedHeader, so the caller can fetch the resource.
	ResourceField string
	// ReplayHeaders are response headers present on a replayed answer
	// (any value but "false"), not on the first one.
	ReplayHeaders []string
	// ReplayStatus, if not zero, is the status a replay carries instead of
	// the original's. It is informational: idem's decisions do not read
	// it (a replay is classified by its status like any answer).
	ReplayStatus int
	// KeepsErrors reports whether the provider stores and replays non-2xx
	// answers too. When false, a retry after a 4xx or 5xx is performed
	// anew: a replayed error never comes back. It is informational: idem
	// retries by status and codes alone, which is safe either way, since a
	// resend under the same key is never a second operation while the
	// provider remembers the key.
	KeepsErrors bool
	// Source is where the facts above come from (documentation URLs), and
	// Checked when they were last read there. Unverified lists the facts
	// that the source did not confirm.
	Source, Checked, Unverified string
}

// Profiles of providers, as their public documentation described them when
// Checked. Providers change their rules: check Source before relying on a
// limit. To adjust one, copy it (p := idem.PayPalOrders; p.Retention = 72 *
// time.Hour) rather than change the package's value.
var (
	// Stripe is Stripe's API v1: Idempotency-Key, up to 255 characters,
	// keys pruned once they are at least 24 hours old, results stored
	// whether they succeed or fail (500s included), 409
	// idempotency_key_in_use for a request still running,
	// idempotency_error for a key reused with other parameters, replays
	// marked Idempotent-Replayed: true, Stripe-Should-Retry as a hint.
	// Keys on POST only (a key on GET or DELETE "has no effect"); idem
	// keys POST and PATCH as by default.
	//
	// Source: https://docs.stripe.com/api/idempotent_requests and
	// https://docs.stripe.com/idempotency, read 2026-12-02. Unverified: the
	// alphabet of keys (any visible ASCII is assumed).
	Stripe = Provider{
		Name: "Stripe", Header: "Idempotency-Key", KeyMaxLen: 255,
		Retention: 24 * time.Hour, RetryHints: []string{"Stripe-Should-Retry"},
		InProgressCodes: []string{"idempotency_key_in_use"}, KeyReusedCodes: []string{"idempotency_error"},
		ReplayHeaders: []string{"Idempotent-Replayed"}, KeepsErrors: true,
		Source:     "https://docs.stripe.com/api/idempotent_requests https://docs.stripe.com/idempotency",
		Checked:    "2026-12-02",
		Unverified: "key alphabet",
	}

	// StripeV2 is Stripe's API v2 (the /v2 namespace): Idempotency-Key on
	// POST and DELETE, keys honoured for 30 days, and a failed or
	// partially failed first request worked to completion on a retry
	// (re-executed, not replayed): a successful operation is never
	// repeated. idem keys POST and DELETE with it and journals both. With
	// this profile idem's resend window may run to 30 days less an hour.
	//
	// Source: https://docs.stripe.com/api-v2-overview#idempotency and
	// https://docs.stripe.com/api/idempotent_requests?api-version=2026-09-30.preview
	// ("With API v2, retries don't repeat successful operations. Stripe
	// retries failed or partially failed work to completion"), read
	// 2026-12-02. Unverified: the 30 days and the keyed DELETE (the
	// overview's idempotency section was not in the text we could read;
	// both are as issue 31 quotes it), the answer to a concurrent request,
	// the longest key (255 assumed, as v1).
	StripeV2 = Provider{
		Name: "Stripe API v2", Header: "Idempotency-Key", KeyMaxLen: 255,
		Retention: 30 * 24 * time.Hour, Methods: []string{http.MethodPost, http.MethodDelete},
		RetryHints:    []string{"Stripe-Should-Retry"},
		ReplayHeaders: []string{"Idempotent-Replayed"},
		Source:        "https://docs.stripe.com/api-v2-overview#idempotency https://docs.stripe.com/api/idempotent_requests?api-version=2026-09-30.preview",
		Checked:       "2026-12-02",
		Unverified:    "30-day retention and keyed DELETE (as issue 31 quotes the overview); concurrent answer; longest key",
	}

	// PayPal is PayPal's REST APIs when the API family is not known:
	// PayPal-Request-Id, up to 108 characters, and the shortest retention
	// any family documents, 3 hours (Payment Method Tokens v3, the vault;
	// Payment Experience v1), so that no resend is ever a new request.
	// With it idem's resend window is 2.5 hours. PayPal returns "the
	// latest status of the previous request" for a reused key;
	// PAYPAL_REQUEST_ID_PREVIOUSLY_USED (vault v3) and DUPLICATE_REQUEST_ID
	// (Payments v1, Payment Experience v1) say a key was used for another
	// request: final. Two simultaneous requests: PayPal "might fail the
	// second". Use the profile of your API (PayPalOrders, PayPalVault,
	// PayPalSubscriptions, PayPalPaymentsV1, PayPalPaymentsV2) for its
	// own retention.
	//
	// Source: https://developer.paypal.com/api/rest/reference/idempotency/
	// ("see the reference for your API" for how long the ID is stored),
	// https://developer.paypal.com/api/payment-tokens/v3/errors/paypal_request_id_previously_used,
	// https://developer.paypal.com/api/payment-experience/v1/errors/duplicate_request_id,
	// read 2026-12-02. Unverified: the per-API retentions (from PayPal's
	// OpenAPI specifications as issue 31 quotes them; the pages we could
	// read do not state them), the key alphabet, the status of the
	// key-reused answers and of a concurrent request.
	PayPal = Provider{
		Name: "PayPal", Header: "PayPal-Request-Id", KeyMaxLen: 108,
		Retention:      3 * time.Hour,
		KeyReusedCodes: []string{"PAYPAL_REQUEST_ID_PREVIOUSLY_USED", "DUPLICATE_REQUEST_ID"},
		Source:         "https://developer.paypal.com/api/rest/reference/idempotency/ https://developer.paypal.com/api/payment-tokens/v3/errors/paypal_request_id_previously_used https://developer.paypal.com/api/payment-experience/v1/errors/duplicate_request_id",
		Checked:        "2026-12-02",
		Unverified:     "per-API retentions (issue 31's reading of PayPal's OpenAPI specifications); key alphabet; statuses of the key-reused and concurrent answers",
	}

	// PayPalOrders is PayPal's Orders v2: as PayPal, kept 6 hours (up to
	// 72 hours on request to PayPal): a resend window of 5 hours.
	//
	// Source: https://developer.paypal.com/docs/api/orders/v2/, read late
	// 2026 (recorded in idem's earlier profile). Unverified: as PayPal.
	PayPalOrders = paypal("PayPal Orders v2", 6*time.Hour, "https://developer.paypal.com/docs/api/orders/v2/")

	// PayPalVault is PayPal's Payment Method Tokens v3 (the vault): as
	// PayPal, kept 3 hours, PAYPAL_REQUEST_ID_PREVIOUSLY_USED for a key
	// used by another request: a resend window of 2.5 hours.
	//
	// Source: https://developer.paypal.com/api/payment-tokens/v3/ and its
	// error page for PAYPAL_REQUEST_ID_PREVIOUSLY_USED, read 2026-12-02.
	// Unverified: the 3 hours (issue 31's reading of the OpenAPI
	// specification).
	PayPalVault = paypal("PayPal Payment Method Tokens v3", 3*time.Hour, "https://developer.paypal.com/api/payment-tokens/v3/ https://developer.paypal.com/api/payment-tokens/v3/errors/paypal_request_id_previously_used")

	// PayPalSubscriptions is PayPal's Subscriptions v1: as PayPal, kept
	// 72 hours. Unverified: the 72 hours (issue 31's reading of the
	// OpenAPI specification).
	PayPalSubscriptions = paypal("PayPal Subscriptions v1", 72*time.Hour, "https://developer.paypal.com/docs/api/subscriptions/v1/")

	// PayPalPaymentsV1 is PayPal's Payments v1 (deprecated): as PayPal,
	// kept 30 days, DUPLICATE_REQUEST_ID for a key used by another request.
	// Unverified: the 30 days (issue 31's reading of the OpenAPI
	// specification).
	PayPalPaymentsV1 = paypal("PayPal Payments v1", 30*24*time.Hour, "https://developer.paypal.com/api/deprecated/payments/v1/errors/duplicate_request_id")

	// PayPalPaymentsV2 is PayPal's Payments v2 (authorizations, captures,
	// refunds): as PayPal, kept 45 days. Unverified: the 45 days (issue
	// 31's reading of the OpenAPI specification).
	PayPalPaymentsV2 = paypal("PayPal Payments v2", 45*24*time.Hour, "https://developer.paypal.com/docs/api/payments/v2/")

	// Adyen is Adyen's APIs: Idempotency-Key on POST, up to 64 characters,
	// kept per company account (a key is not shared across regional live
	// endpoints), the key echoed in the answer, the first answer returned
	// to a retry of a request already processed. A duplicate that arrives
	// while the first request is processing gets 422 (or 409) with
	// errorCode "704" ("request already processed or in progress") and a
	// transient-error: true header: retried with the same key, and left in
	// doubt (pending) when attempts run out. Retention: Adyen's current
	// page says 7 to 14 days (older versions said at least 31 days); the
	// profile takes 7 days, a resend window of 7 days less an hour.
	//
	// Source: https://docs.adyen.com/development-resources/api-idempotency,
	// read 2026-12-02. Unverified: the 7-day retention, the 704 code and
	// the transient-error header (the "Error handling" section of the page
	// was cut from the text we could read; as issue 31 quotes it; the
	// older page confirms the 31 days and that section's heading), the
	// key alphabet, the answer to another payload, whether errors are kept.
	Adyen = Provider{
		Name: "Adyen", Header: "Idempotency-Key", KeyMaxLen: 64,
		Retention:       7 * 24 * time.Hour,
		RetryHints:      []string{"Transient-Error"},
		InProgressCodes: []string{"704"},
		Source:          "https://docs.adyen.com/development-resources/api-idempotency",
		Checked:         "2026-12-02",
		Unverified:      "7-day retention, 704 and transient-error (as issue 31 quotes the page); key alphabet; other-payload answer; whether errors are kept",
	}

	// GoCardless is GoCardless's Pro API: Idempotency-Key on every create
	// call (POST). A key a resource was already created under is answered
	// 409, error type invalid_state, errors[].reason
	// idempotent_creation_conflict, with links.conflicting_resource_id
	// naming the resource: the request was performed and its answer is not
	// replayed. idem returns that 409 as it is, marked with
	// PerformedHeader (resource=...), sends nothing more, and records the
	// operation as succeeded with the text "performed by server, answer
	// not kept (conflicting resource PM...)": fetch the resource for its
	// state, as GoCardless's SDKs do (Ruby: on_idempotency_conflict:
	// :fetch; Node: IdempotentCreationConflictError).
	//
	// Source: https://gocardless.com/blog/idempotency-keys/ (the 409
	// answer), https://rubydoc.info/gems/gocardless_pro/3.6.0/GoCardlessPro/InvalidStateError
	// (idempotent_creation_conflict, conflicting_resource_id) and
	// https://github.com/gocardless/gocardless-nodejs, read 2026-12-02.
	// Unverified: the retention (not found: idem's default 23-hour window
	// stays), the longest key (idempotency_key_too_long exists, its limit
	// was not found: 255 assumed), the answer to a concurrent request,
	// the key alphabet.
	GoCardless = Provider{
		Name: "GoCardless", Header: "Idempotency-Key",
		PerformedCodes: []string{"idempotent_creation_conflict"}, ResourceField: "conflicting_resource_id",
		Source:     "https://gocardless.com/blog/idempotency-keys/ https://rubydoc.info/gems/gocardless_pro/3.6.0/GoCardlessPro/InvalidStateError https://github.com/gocardless/gocardless-nodejs",
		Checked:    "2026-12-02",
		Unverified: "retention; longest key; concurrent answer; key alphabet",
	}

	// Square is Square's API: the key travels in the JSON body's
	// idempotency_key member of each create call (BodyKeyField), which
	// idem writes before the request is journaled and first sent; the
	// same key with the same request returns the first successful answer,
	// and with another request an error (IDEMPOTENCY_KEY_REUSED, final).
	// Square does not publish how long it keeps keys: idem's default
	// 23-hour window stays. Keys up to 45 characters (CreatePayment's
	// limit, the shortest we know of; a UUID fits).
	//
	// Source: https://developer.squareup.com/docs/working-with-apis/idempotency
	// and Square's answer on its forum ("We do not publish a retention
	// period for CreatePayment idempotency keys",
	// https://developer.squareup.com/forums/t/how-long-are-idempotency-keys-retained-for-the-createpayment-endpoint/28303),
	// read 2026-12-02. Unverified: the 45-character limit (per endpoint in
	// Square's API reference, not read here), the status of
	// IDEMPOTENCY_KEY_REUSED, the answer to a concurrent request, whether
	// errors are kept.
	Square = Provider{
		Name: "Square", BodyKeyField: "idempotency_key", KeyMaxLen: 45,
		KeyReusedCodes: []string{"IDEMPOTENCY_KEY_REUSED"},
		Source:         "https://developer.squareup.com/docs/working-with-apis/idempotency https://developer.squareup.com/forums/t/how-long-are-idempotency-keys-retained-for-the-createpayment-endpoint/28303",
		Checked:        "2026-12-02",
		Unverified:     "45-character limit; status of IDEMPOTENCY_KEY_REUSED; concurrent answer; whether errors are kept; retention (not published)",
	}

	// CheckoutCom is Checkout.com's API: Cko-Idempotency-Key, keys kept
	// 24 hours (production and sandbox; longer on request), only 2xx
	// results kept (after a 4xx or 5xx the payment is attempted again), a
	// replay answered with the original status and body, and a concurrent
	// request under the same key answered 429 (which idem retries, as any
	// 429).
	//
	// Source: https://www.checkout.com/docs/payments/manage-payments/idempotency
	// (last updated February 12, 2025) and
	// https://checkout.com/docs/payments/manage-payments/retry-a-payment
	// (last updated January 7, 2026), read 2026-12-02. Unverified: the 429
	// (both pages' text we could read cut off at "If we detect concurrent
	// requests with the same idempotency key, only one request is"; as
	// issue 31 quotes them), the longest key (not published; 255
	// assumed), the key alphabet, the answer to another payload. The
	// earlier profile's 409 for a running request and 202 replay, from a
	// support article (https://support.checkout.com/hc/en-us/articles/26763450855186),
	// could not be confirmed and are dropped.
	CheckoutCom = Provider{
		Name: "Checkout.com", Header: "Cko-Idempotency-Key",
		Retention:  24 * time.Hour,
		Source:     "https://www.checkout.com/docs/payments/manage-payments/idempotency https://checkout.com/docs/payments/manage-payments/retry-a-payment",
		Checked:    "2026-12-02",
		Unverified: "429 for a concurrent request (cut from the text we read); longest key; key alphabet; other-payload answer",
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

// paypal returns the PayPal profile of one API family, kept retention.
func paypal(name string, retention time.Duration, source string) Provider {
	p := PayPal
	p.Name, p.Retention = name, retention
	p.Source = source + " " + PayPal.Source
	p.Unverified = "retention (issue 31's reading of PayPal's OpenAPI specification); key alphabet; statuses of the key-reused and concurrent answers"
	return p
}

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
//     be a second charge. PayPal's 3 hours give a window of 2.5 hours,
//     PayPalOrders' 6 hours one of 5 hours;
//   - the methods p keys (p.Methods, when it names them) are the keyed
//     methods, as WithKeyedMethods sets them (StripeV2: POST and DELETE);
//   - p's retry hints and error codes teach the classifier when to retry,
//     when an answer means "in progress", and when it means "performed".
//
// A later WithKeyHeader or WithKeyedMethods still changes the header or the
// methods. The zero Provider changes nothing.
func WithProvider(p Provider) Option {
	// The profile's slices are copied: a change to the package's profile
	// after this call does not reach the Client.
	p.RetryHints, p.InProgressCodes = slices.Clone(p.RetryHints), slices.Clone(p.InProgressCodes)
	p.KeyReusedCodes, p.ReplayHeaders = slices.Clone(p.KeyReusedCodes), slices.Clone(p.ReplayHeaders)
	p.PerformedCodes, p.Methods = slices.Clone(p.PerformedCodes), slices.Clone(p.Methods)
	return func(c *config) {
		c.provider = &p
		if p.Header != "" {
			c.header = http.CanonicalHeaderKey(p.Header)
			c.headerSet = true
		}
		if len(p.Methods) > 0 {
			WithKeyedMethods(p.Methods...)(c)
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

// classify reads p's dialect (see read) in a failed answer: its headers,
// and for a 4xx whose codes p teaches, the body's first bytes (peekBody:
// bounded in bytes and time, put back for the caller). It reports false
// when p says nothing about resp. An answer p reads as performed carries
// PerformedHeader from here on, with the resource p found.
func (p *Provider) classify(resp *http.Response) (verdict, string, bool) {
	code := resp.StatusCode
	if code < 400 {
		return 0, "", false
	}
	var peek []byte
	if code < 500 && len(p.InProgressCodes)+len(p.KeyReusedCodes)+len(p.PerformedCodes) > 0 {
		peek, _ = peekBody(resp) // nil when there is none, or it stalled
	}
	r, ok := p.read(code, resp.Header, peek)
	if !ok {
		return 0, "", false
	}
	if r.v == performed {
		setPerformed(resp, Performed{Resource: r.resource})
	}
	return r.v, r.reason, true
}

// setPerformed marks resp with PerformedHeader.
func setPerformed(resp *http.Response, p Performed) {
	if resp.Header == nil {
		resp.Header = make(http.Header, 1)
	}
	resp.Header[PerformedHeader] = []string{p.String()}
}
