package idem

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
)

// Context keys.
type (
	keyContext       struct{}
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
// take turns: a later one waits for the earlier one to end.
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

// chooseKey returns the key and operation name for a keyed request: WithKey,
// then WithOperation, then the request's key header (in any spelling), then
// a new key. For a named operation the key is a candidate: the journal
// returns the name's key if it has one.
func (t *Transport) chooseKey(req *http.Request) (key, name string, src keySource, err error) {
	ctx := req.Context()
	if k, ok := ctx.Value(keyContext{}).(string); ok {
		return k, "", keyFromContext, t.cfg.checkKey(k)
	}
	if n, ok := ctx.Value(operationContext{}).(string); ok {
		if n == "" || len(n) > maxNameLen {
			return "", "", keyFromName, fmt.Errorf("operation name must be 1 to %d bytes, got %d", maxNameLen, len(n))
		}
		key, err := t.cfg.newKey()
		return key, n, keyFromName, err
	}
	if k := headerKey(req.Header, t.cfg.header); k != "" {
		return k, "", keyFromHeader, t.cfg.checkKey(k)
	}
	key, err = t.cfg.newKey()
	return key, "", keyNew, err
}

// newKey returns a random UUIDv7: random enough to be unguessable, and time
// ordered so the journal's B+tree appends on its rightmost leaf.
func newKey() (string, error) {
	u, err := uuid.NewV7()
	if err != nil {
		return "", fmt.Errorf("generating key: %w", err)
	}
	return u.String(), nil
}

// maxKeyLen and maxNameLen bound keys and operation names.
const (
	maxKeyLen  = 255
	maxNameLen = 1024
)

// validKey checks that k can be sent as a header value and stored.
func validKey(k string) error {
	if k == "" || len(k) > maxKeyLen {
		return fmt.Errorf("key must be 1 to %d bytes, got %d", maxKeyLen, len(k))
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return fmt.Errorf("key %s has a byte 0x%02x that is not visible ASCII", quote(k), k[i])
		}
	}
	return nil
}

// recentCalls remembers, for a short while, the calls that ended without a
// definite answer (in doubt, or with a transient status), by payload
// fingerprint and credentials (see matchKey): a caller's resend of the same
// payload (an SDK's own retry loop, a double submit) reuses their key
// instead of getting a new one.
type recentCalls struct {
	mu      sync.Mutex
	window  time.Duration
	entries map[[32]byte]recentCall
}

type recentCall struct {
	key string
	at  time.Time
}

// maxRecent bounds the index; older entries are pruned first.
const maxRecent = 4096

func (r *recentCalls) add(mk [32]byte, key string) {
	if r.window <= 0 || mk == ([32]byte{}) {
		return
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.entries == nil {
		r.entries = make(map[[32]byte]recentCall)
	}
	if len(r.entries) >= maxRecent {
		for k, e := range r.entries {
			if now.Sub(e.at) > r.window {
				delete(r.entries, k)
			}
		}
		if len(r.entries) >= maxRecent {
			return
		}
	}
	r.entries[mk] = recentCall{key: key, at: now}
}

func (r *recentCalls) forget(mk [32]byte, key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.entries[mk]; ok && e.key == key {
		delete(r.entries, mk)
	}
}

// match returns the key of a recent call with match key mk.
func (r *recentCalls) match(mk [32]byte) (string, bool) {
	if mk == ([32]byte{}) {
		return "", false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[mk]
	if !ok || time.Since(e.at) > r.window {
		return "", false
	}
	return e.key, true
}

// matchKey returns the key under which recentCalls knows a call: the
// payload's fingerprint and a digest of the call's credentials (secret
// headers, the URL's user info and secret query parameters), so that the
// same payload sent for another account is never taken for a resend. It
// stays in memory. It is zero when matching is off.
func (c *config) matchKey(fp [32]byte, req *http.Request) [32]byte {
	if c.matchWindow <= 0 {
		return [32]byte{}
	}
	var creds []string // in a fixed order: maps iterate at random
	for k, vs := range req.Header {
		if ck := http.CanonicalHeaderKey(k); c.secret[ck] {
			for _, v := range vs {
				creds = append(creds, fmt.Sprintf("h%d:%s=%d:%s", len(ck), ck, len(v), v))
			}
		}
	}
	if u := req.URL.User; u != nil {
		creds = append(creds, "u"+u.String())
	}
	if req.URL.RawQuery != "" && c.hasSecretQuery(req.URL.RawQuery) {
		for k, vs := range req.URL.Query() {
			if c.secretQuery[k] || c.secretQuery[strings.ToLower(k)] {
				creds = append(creds, fmt.Sprintf("q%d:%s=%q", len(k), k, vs))
			}
		}
	}
	if len(creds) == 0 {
		return fp // no credentials: the payload alone
	}
	slices.Sort(creds)
	d := sha256.New()
	d.Write(fp[:])
	for _, s := range creds {
		fmt.Fprintf(d, "%d:%s;", len(s), s)
	}
	var out [32]byte
	d.Sum(out[:0])
	return out
}
