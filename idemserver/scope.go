package idemserver

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"path"
)

// ErrNoCredentials is returned by the principal function CredentialsPrincipal
// makes for a request that carries none of its credential headers; the
// middleware answers it 401.
var ErrNoCredentials = errors.New("idemserver: the request carries no credentials")

// WithSingleTenant is the service's word that it has one tenant: every
// request is in one principal, so a key sent by anyone reaches the answer
// stored under it by anyone. Without it or a principal function
// (WithPrincipal), Required and Optional panic: keys shared by every
// caller let one caller read another's answer (the same key and body),
// learn whether a key was used (another body gets 422), or poison a
// guessable key before its owner sends it. A later WithPrincipal replaces
// it, and it replaces an earlier WithPrincipal.
func WithSingleTenant() Option {
	return func(c *config) { c.principal, c.single = nil, true }
}

// CredentialsPrincipal returns a principal function for services without
// an authentication context of their own: it names a request's principal
// by a digest (SHA-256) of the values of the named request headers
// (Authorization, X-Api-Key and Api-Key when none are named), so that a
// key sent with other credentials, or with none, never meets it. A request
// with none of the headers gets ErrNoCredentials, and so 401.
//
// The digest is of the credentials, not of who holds them: a token rotated
// between a request and its retry splits the key, and the retry runs the
// handler a second time. It suits long-lived API keys; for session tokens,
// OAuth access tokens and other short-lived credentials, name the account
// the application's authentication found instead (WithPrincipal).
func CredentialsPrincipal(headers ...string) func(*http.Request) (string, error) {
	if len(headers) == 0 {
		headers = []string{"Authorization", "X-Api-Key", "Api-Key"}
	}
	names := make([]string, len(headers))
	for i, h := range headers {
		names[i] = http.CanonicalHeaderKey(h)
	}
	return func(r *http.Request) (string, error) {
		var space [256]byte
		b := appendString(space[:0], "idemserver/credentials/v1")
		found := false
		for _, n := range names {
			for _, v := range r.Header.Values(n) {
				if v != "" {
					found = true
				}
				b = appendString(appendString(b, n), v)
			}
		}
		if !found {
			return "", ErrNoCredentials
		}
		sum := sha256.Sum256(b)
		return "cred:" + hex.EncodeToString(sum[:]), nil
	}
}

// checkScoped panics, as http.ServeMux does for a bad pattern, when a
// route that takes Idempotency-Key would share keys between callers
// because the middleware names no principal and no single tenant.
func (m *Middleware) checkScoped(method string) {
	if m.cfg.principal == nil && !m.cfg.single {
		panic("idemserver: " + method + ": the middleware has no principal function, so every caller would share every key " +
			"(one could read another's stored answer or poison a key before its owner); " +
			"pass idemserver.WithPrincipal(fn) with fn naming the caller your authentication found " +
			"(or idemserver.CredentialsPrincipal() for long-lived API keys), " +
			"or idemserver.WithSingleTenant() if the service has one tenant")
	}
}

// scopePath returns the path a key is scoped by: the request's path
// cleaned (path.Clean), so that /charge/, //charge and /./charge, which
// many routers send to one handler, are one scope.
func scopePath(p string) string {
	if p == "" {
		return "/"
	}
	c := path.Clean(p)
	if c[0] != '/' {
		c = "/" + c
	}
	return c
}
