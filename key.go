package idem

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/google/uuid"

	"github.com/idemgo/idem/internal/keys"
)

// Context keys. WithKey's is internal/keys', so that idemserver's Step
// sets it without importing the client.
type (
	keyContext       = keys.Context
	operationContext struct{}
	noKeyContext     struct{}
)

// WithKey returns a context whose keyed requests use key as their
// idempotency key. It outranks every other source of a key. A key must be 1
// to 255 bytes of visible ASCII. Use it to retry an operation whose key an
// *Error reported.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyContext{}, key)
}

// WithOperation returns a context whose keyed requests belong to the
// durable operation name (for example "pay:order-42"). The first request
// with a name creates and journals a random key for it; every later one,
// in this process or after a restart, gets the same key, so re-driving a
// business action never performs it twice. A finished operation re-driven
// within the resend window is sent again with its key (the server replays
// its answer); beyond the window it is refused with an error matching
// ErrExpired that carries the recorded outcome. Calls of one name at once
// take turns: a later one waits for the earlier one to end. A name is 1 to
// 1024 bytes of valid UTF-8 without NUL bytes, so that every store can keep
// it; any other is refused (ErrInvalidKey) before anything is journaled.
func WithOperation(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, operationContext{}, name)
}

// WithoutKey returns a context whose requests carry no idempotency key and
// are not journaled. A non-idempotent request sent this way is retried only
// when the failure proves it never reached the server.
func WithoutKey(ctx context.Context) context.Context {
	return context.WithValue(ctx, noKeyContext{}, true)
}

func withoutKey(ctx context.Context) bool {
	v, _ := ctx.Value(noKeyContext{}).(bool)
	return v
}

// keySource says where a request's key came from.
type keySource uint8

const (
	keyFromContext keySource = iota + 1
	keyFromName
	keyFromHeader
	keyNew
)

// newKey returns a random UUIDv7 from google/uuid (the dependency the
// design names for keys): random enough to be unguessable, and time
// ordered so the journal's B+tree appends on its rightmost leaf. A key
// made in a fixed array would save one allocation per request; measured,
// and left to google/uuid.
func newKey() (string, error) {
	u, err := uuid.NewV7()
	if err != nil {
		return "", fmt.Errorf("generating key: %w", err)
	}
	return u.String(), nil
}

// maxKeyLen and maxNameLen bound keys and operation names.
const (
	maxKeyLen  = keys.MaxLen
	maxNameLen = 1024
)

// validKey checks that k can be sent as a header value and stored.
func validKey(k string) error { return keys.Check(k) }

// otherHeaderKey returns a value of the key header (in any spelling) other
// than k, or "": a request with two keys is refused, not sent with one.
func otherHeaderKey(h http.Header, name, k string) string {
	for hk, vs := range h {
		if !strings.EqualFold(hk, name) {
			continue
		}
		for _, v := range vs {
			if v != k {
				return v
			}
		}
	}
	return ""
}
