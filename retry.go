package idem

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// RetryPolicy says how often and how patiently the Transport retries. Its
// zero value is usable: every zero field takes the default documented on it,
// so RetryPolicy{} never means "retry instantly forever".
type RetryPolicy struct {
	// MaxAttempts counts attempts, not retries: the first request plus its
	// retries. Zero means 4; 1 disables retries.
	MaxAttempts int
	// Initial is the upper bound of the first backoff wait. Zero means 100ms.
	Initial time.Duration
	// Max caps the upper bound of any backoff wait. Zero means 5s.
	Max time.Duration
	// MaxElapsed caps the time from the first attempt to the start of the
	// last one. Zero means 2 minutes.
	MaxElapsed time.Duration
	// RetryAfterCap caps a server's Retry-After. Zero means 60s.
	RetryAfterCap time.Duration
	// NoJitter makes each wait its full upper bound. By default a wait is
	// drawn uniformly from zero to its bound ("full jitter"), which spreads
	// the retries of many clients after a shared outage.
	NoJitter bool
}

// withDefaults returns p with every zero field set to its default.
func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = 4
	}
	if p.Initial <= 0 {
		p.Initial = 100 * time.Millisecond
	}
	if p.Max <= 0 {
		p.Max = 5 * time.Second
	}
	if p.Max < p.Initial {
		p.Max = p.Initial
	}
	if p.MaxElapsed <= 0 {
		p.MaxElapsed = 2 * time.Minute
	}
	if p.RetryAfterCap <= 0 {
		p.RetryAfterCap = time.Minute
	}
	return p
}

// newBackOff returns the exponential schedule of wait bounds for one
// operation: Initial, 2×Initial, ... capped at Max. Jitter is applied by
// the caller, so the schedule itself is not randomized.
func (p RetryPolicy) newBackOff() *backoff.ExponentialBackOff {
	b := &backoff.ExponentialBackOff{
		InitialInterval:     p.Initial,
		RandomizationFactor: 0,
		Multiplier:          2,
		MaxInterval:         p.Max,
		MaxElapsedTime:      0, // the Transport tracks elapsed time itself
		Stop:                backoff.Stop,
		Clock:               backoff.SystemClock,
	}
	b.Reset()
	return b
}

// jitter returns the wait for a backoff bound d.
func (p RetryPolicy) jitter(d time.Duration) time.Duration {
	if p.NoJitter || d <= 0 {
		return d
	}
	return rand.N(d + 1)
}

// verdict is what an attempt's outcome means for the operation.
type verdict uint8

const (
	// success: a 2xx or 3xx response; the operation is done.
	success verdict = iota + 1
	// transient: try again with the same key after a wait.
	transient
	// permanent: retrying cannot help; return what we have.
	permanent
	// performed: a 409 saying the server handled a request under the key
	// and did not keep its answer (idemserver's ProblemNotKept). Like
	// permanent, the caller gets the 409 and nothing is sent again; the
	// journal records the operation as performed (see notKeptOutcome).
	performed
	// inProgress: the provider says a request under the key is still
	// being processed (Provider.InProgressCodes). It is retried as
	// transient is; when attempts run out, its answer leaves the
	// operation in doubt, never failed.
	inProgress
)

// classifyResponse returns the verdict for a response and the reason, for
// logs. A server's explicit hint (Stripe-Should-Retry, X-Should-Retry)
// wins over the status table. A 409 is read to tell "in progress"
// (transient) from "key already used" (permanent) and from "performed, its
// answer not kept" (performed); its body stays readable for the caller.
func classifyResponse(resp *http.Response) (verdict, string) {
	code := resp.StatusCode
	if code < 200 || code >= 400 {
		for _, h := range [...]string{"Stripe-Should-Retry", "X-Should-Retry"} {
			switch strings.ToLower(strings.TrimSpace(resp.Header.Get(h))) {
			case "true":
				return transient, strconv.Itoa(code) + " " + h + ": true"
			case "false":
				return permanent, strconv.Itoa(code) + " " + h + ": false"
			}
		}
	}
	switch {
	case code >= 200 && code < 400:
		return success, strconv.Itoa(code)
	case code == http.StatusConflict:
		switch readConflict(resp) {
		case permanent:
			return permanent, "409 key already used"
		case performed:
			return performed, "409 performed, answer not kept"
		}
		return transient, "409 in progress"
	case transientStatus(code):
		return transient, strconv.Itoa(code)
	}
	return permanent, strconv.Itoa(code)
}

// transientStatus reports whether a status is worth retrying with the same
// key: 408, 425, 429, 500, 502, 503, 504 and 529 ("overloaded").
func transientStatus(code int) bool {
	switch code {
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests,
		http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable,
		http.StatusGatewayTimeout, 529:
		return true
	}
	return false
}

// notKeptType is the fragment of the type URI of idemserver's
// ProblemNotKept (idemserver cannot be imported here; a test there checks
// that they agree).
const notKeptType = "#already-used-response-not-kept"

// readConflict tells what a 409 says: transient when the first request is
// in progress, permanent when the key was already used for another
// request, performed when the server handled a request under the key and
// did not keep its answer (a problem whose type ends in notKeptType; its
// original_status member, the status first sent when known, is kept on
// the body for notKeptStatus). It reads the RFC 9457 problem's type and
// code (or a JSON error's code, as Stripe sends it) from the body's
// first bytes, as peekBody bounds them in bytes and time and puts them
// back for the caller. A 409 it cannot read, in time or at all, is "in
// progress", the draft's meaning of a bare 409.
func readConflict(resp *http.Response) verdict {
	peek, pb := peekBody(resp)
	if pb == nil {
		return transient // no body, or one that stalls or fails: in progress
	}
	var p struct {
		Type, Code     string
		Error          json.RawMessage
		OriginalStatus int `json:"original_status"`
	}
	if json.Unmarshal(peek, &p) != nil {
		return transient
	}
	if strings.HasSuffix(p.Type, notKeptType) {
		if p.OriginalStatus >= 100 && p.OriginalStatus <= 999 {
			pb.original = p.OriginalStatus
		}
		return performed
	}
	var inner struct{ Type, Code string }
	_ = json.Unmarshal(p.Error, &inner)
	for _, s := range [...]string{p.Type, p.Code, inner.Type, inner.Code} {
		s = strings.ToLower(s)
		if strings.Contains(s, "progress") || strings.Contains(s, "in_use") || strings.Contains(s, "in-use") {
			return transient
		}
		for _, w := range [...]string{"already_used", "already-used", "reused", "key-reuse", "key_reuse", "mismatch"} {
			if strings.Contains(s, w) {
				return permanent
			}
		}
	}
	return transient
}

// classifyError returns the verdict for an attempt that ended without a
// response. sent reports whether the request may have reached the server
// (it is false only when the error proves the connection was never made).
func classifyError(err error) (v verdict, reason string, sent bool) {
	var (
		certErr  *tls.CertificateVerificationError
		unknownA x509.UnknownAuthorityError
		hostErr  x509.HostnameError
		invalid  x509.CertificateInvalidError
		opErr    *net.OpError
		dnsErr   *net.DNSError
	)
	switch {
	case errors.As(err, &certErr), errors.As(err, &unknownA), errors.As(err, &hostErr), errors.As(err, &invalid):
		return permanent, "tls verification failed", false
	case errors.As(err, &dnsErr):
		if dnsErr.IsNotFound {
			return permanent, "host not found", false
		}
		return transient, "dns lookup failed", false
	case errors.As(err, &opErr) && opErr.Op == "dial":
		return transient, "connection failed", false
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return transient, "connection closed", true
	case errors.Is(err, context.DeadlineExceeded):
		return transient, "timeout", true
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return transient, "timeout", true
	}
	return transient, "network error", true
}

// serverDelay returns the wait a response asks for: Retry-After-Ms
// (milliseconds) if it is valid, else Retry-After, and which one set it.
func serverDelay(h http.Header, now time.Time) (time.Duration, string, bool) {
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		ms, err := strconv.ParseFloat(v, 64)
		if errors.Is(err, strconv.ErrRange) && ms > 0 {
			err = nil // ParseFloat gives +Inf: a wait too long to say, capped below
		}
		switch {
		case err != nil || !(ms >= 0): // malformed, negative or NaN: ignored
		case ms < float64(1<<62)/1e6:
			return time.Duration(ms * float64(time.Millisecond)), "Retry-After-Ms", true
		default: // too large for a Duration, as a huge Retry-After: the caller caps it
			return time.Duration(1<<63 - 1), "Retry-After-Ms", true
		}
	}
	if d, ok := retryAfter(h.Get("Retry-After"), now); ok {
		return d, "Retry-After", true
	}
	return 0, "", false
}

// retryAfter parses a Retry-After header value: delay-seconds or an
// HTTP-date (RFC 9110 §10.2.3). It reports false for an absent or malformed
// value. A date in the past means no wait. Huge values are not an error:
// the caller caps them.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		secs, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			if errors.Is(err, strconv.ErrRange) {
				return time.Duration(1<<63 - 1), true
			}
			return 0, false
		}
		if secs > uint64((1<<63-1)/time.Second) {
			return time.Duration(1<<63 - 1), true
		}
		return time.Duration(secs) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	if d := t.Sub(now); d > 0 {
		return d, true
	}
	return 0, true
}

// sleep waits for d or until ctx is done, and then returns its cause.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return context.Cause(ctx)
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// lazyBackOff creates the backoff schedule on the first retry only, so that
// a request that needs no retry does not pay for it.
type lazyBackOff struct {
	p  RetryPolicy
	bo *backoff.ExponentialBackOff
}

// NextBackOff returns the next wait bound of the schedule.
func (l *lazyBackOff) NextBackOff() time.Duration {
	if l.bo == nil {
		l.bo = l.p.newBackOff()
	}
	return l.bo.NextBackOff()
}
