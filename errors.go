package idem

import (
	"errors"
	"fmt"
	"strings"
)

// Errors about a request or operation. The transport returns them inside an
// *Error that carries the key and the attempts made; match with errors.Is.
var (
	// ErrKeyReused is returned when a key is already journaled with a
	// different payload fingerprint. Nothing is sent.
	ErrKeyReused = errors.New("idem: idempotency key reused with a different payload")
	// ErrBodyTooLarge is returned when a keyed request's body exceeds the
	// journal's body limit. Nothing is sent.
	ErrBodyTooLarge = errors.New("idem: request body exceeds the journal body limit")
	// ErrNoCredentials is returned by Resume for an operation whose
	// credentials were not journaled when no WithResumePrepare hook is set.
	// Nothing is sent; the operation stays pending.
	ErrNoCredentials = errors.New("idem: resend needs credentials (set WithResumePrepare)")
	// ErrRedirected is returned when net/http's client follows a redirect
	// that re-sends a keyed request with its body (a 307 or 308 answer to
	// a POST) through the Transport: under a new key it would be a second
	// operation, so it is not sent. The first request's operation ended
	// with the redirect's status. Client.HTTPClient does not follow such a
	// redirect; it returns the 307 or 308 to the caller.
	ErrRedirected = errors.New("idem: a keyed request redirected with its body is not sent again under a new key")
	// ErrInvalidRequest is returned for a request that can never be sent (no
	// URL, a scheme other than http or https, no host, a header name that is
	// not a token or a value with a control byte other than HTAB, a key
	// header name that is not a token, a body whose length is not its
	// ContentLength, a GetBody that returns no body). Nothing is journaled
	// or sent.
	ErrInvalidRequest = errors.New("idem: invalid request")
	// ErrBodyChanged is returned when a body too large to journal
	// (WithUnjournaledLargeBodies) streamed to the server with other
	// bytes than the ones fingerprinted: the request's GetBody did not
	// return the same bytes each time. The attempt's stream is cut before
	// its last bytes and nothing is sent after it; the operation stays in
	// doubt, since an earlier attempt may have been performed.
	ErrBodyChanged = errors.New("idem: GetBody returned other bytes than those fingerprinted under the key")
	// ErrNotKeyed is returned, matching ErrInvalidRequest too, for a
	// request whose context asks for a key (WithKey, WithOperation) with
	// a method the Client does not key (WithKeyedMethods, Provider.Methods):
	// it would go out without its key and unjournaled. Nothing is sent.
	ErrNotKeyed = errors.New("idem: method is not keyed")
	// ErrAttemptsExhausted is returned when the last allowed attempt ended
	// without a response. The operation stays pending: its outcome is unknown.
	ErrAttemptsExhausted = errors.New("idem: attempts exhausted without a response")
	// ErrDeadline is returned when the wait before the next attempt would not
	// end before the context's deadline, so idem stopped instead of sleeping.
	ErrDeadline = errors.New("idem: next retry would outlast the context deadline")
	// ErrRetryTimeout is returned when the policy's total time is used up.
	ErrRetryTimeout = errors.New("idem: retry time limit reached")
	// ErrRetryBudget is returned when the host's retry budget (see
	// WithRetryBudget) has no token left for another retry.
	ErrRetryBudget = errors.New("idem: retry budget for the host exhausted")
	// ErrNotRetryable is returned when an attempt failed without a response
	// in a way that retrying cannot fix (for example a TLS verification error),
	// or when the failure of a request without a key may have reached the server.
	ErrNotRetryable = errors.New("idem: failure is not retryable")
	// ErrExpired is returned when an operation is older than the resend
	// window (the server may have forgotten its key), or was expired (by
	// Resume past that window, or by an operator with idem expire, which is
	// final): idem does not send it again. The application must reconcile
	// it.
	ErrExpired = errors.New("idem: operation expired, not sent again")
)

// Error is the error the transport returns when a keyed operation ends
// without a response for the caller. Cause says why idem stopped (one of the
// sentinels above); Err is the last underlying error, if any. Both match with
// errors.Is and errors.As.
type Error struct {
	// Key is the operation's idempotency key as the journal holds it, or ""
	// when no key was journaled (the request was refused before). A caller
	// may retry the same operation later with WithKey(ctx, Key).
	Key string
	// Name is the operation name given with WithOperation, or "".
	Name string
	// Attempts counts the attempts made by this call.
	Attempts int
	// State is the operation's state in the journal after this call.
	// StatePending means its outcome is unknown and Resume will finish it.
	State State
	// LastStatus is the status of the last response received, or 0.
	LastStatus int
	// Cause is why idem stopped, one of the sentinels of this package:
	// ErrAttemptsExhausted, ErrDeadline, ErrInProgress, ErrKeyReused,
	// ErrJournalWrite, ... It may be nil when Err says all.
	Cause error
	// Err is the last underlying error (network, context, journal), or nil.
	Err error
}

// Error returns a one-line description with the key, attempts and causes.
// A URL in Err's text is shown as RedactURL shows it; Err itself is left
// as it was.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("idem: ")
	if e.Cause != nil {
		b.WriteString(strings.TrimPrefix(e.Cause.Error(), "idem: "))
	} else {
		b.WriteString("operation failed")
	}
	if e.Key != "" {
		fmt.Fprintf(&b, " (key %s", quote(e.Key))
	} else {
		b.WriteString(" (no key journaled")
	}
	if e.Name != "" {
		fmt.Fprintf(&b, ", operation %s", quote(e.Name))
	}
	fmt.Fprintf(&b, ", %d attempts", e.Attempts)
	if e.State != 0 {
		fmt.Fprintf(&b, ", %s", e.State)
	}
	b.WriteString(")")
	if e.Err != nil {
		b.WriteString(": ")
		// A *url.Error quotes the URL with its query; an Err that wraps
		// Cause would say it twice.
		msg := secrets.redactText(e.Err.Error())
		if e.Cause != nil {
			msg = strings.TrimPrefix(msg, e.Cause.Error()+": ")
		}
		b.WriteString(msg)
	}
	return b.String()
}

// Unwrap returns Cause and Err, so errors.Is and errors.As see both.
func (e *Error) Unwrap() []error {
	errs := make([]error, 0, 2)
	if e.Cause != nil {
		errs = append(errs, e.Cause)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// maxQuoted bounds how much of a key or name an error or log line shows.
const maxQuoted = 64

// quote returns s quoted for an error text, shortened to maxQuoted bytes:
// a key or name from a request must not inject lines into a log or print
// a megabyte.
func quote(s string) string {
	if len(s) > maxQuoted {
		return fmt.Sprintf("%q…(%d bytes)", s[:maxQuoted], len(s))
	}
	return fmt.Sprintf("%q", s)
}
