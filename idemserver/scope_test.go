package idemserver_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemserver"
)

// TestUnscopedRoutesPanic: a middleware with neither a principal function
// nor WithSingleTenant refuses to wrap a Required or Optional route, with
// a message that says what to pass; Webhook routes, scoped by their
// verification, and scoped middlewares wrap.
func TestUnscopedRoutesPanic(t *testing.T) {
	s := idemserver.NewMemoryStore()
	defer s.Close()
	mw := idemserver.New(s)
	defer mw.Close()
	for name, wrap := range map[string]func(http.Handler) http.Handler{"Required": mw.Required, "Optional": mw.Optional} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				msg, _ := recover().(string)
				require.NotEmpty(t, msg, "%s wrapped a route of an unscoped middleware", name)
				assert.Contains(t, msg, "idemserver: "+name)
				assert.Contains(t, msg, "WithPrincipal")
				assert.Contains(t, msg, "WithSingleTenant()")
			}()
			wrap(&app{})
		})
	}
	assert.NotPanics(t, func() { mw.Webhook(&app{}, nil) })
	assert.NotPanics(t, func() { idemserver.New(s, idemserver.WithSingleTenant()).Required(&app{}) })
	assert.NotPanics(t, func() {
		idemserver.New(s, idemserver.WithPrincipal(idemserver.CredentialsPrincipal())).Optional(&app{})
	})
	// A later option replaces an earlier one: single tenant, then no principal function at all.
	assert.Panics(t, func() {
		idemserver.New(s, idemserver.WithSingleTenant(), idemserver.WithPrincipal(nil)).Required(&app{})
	})
}

// accountKey is the context key under which authenticate puts the account.
type accountKey struct{}

// authenticate is an application's authentication: it puts the account a
// bearer token names in the request's context, and leaves the context
// alone for a request without a valid token (a public route may serve it).
func authenticate(next http.Handler) http.Handler {
	accounts := map[string]string{"Bearer alice-token": "acct_alice", "Bearer bob-token": "acct_bob"}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if acct, ok := accounts[r.Header.Get("Authorization")]; ok {
			r = r.WithContext(context.WithValue(r.Context(), accountKey{}, acct))
		}
		next.ServeHTTP(w, r)
	})
}

// accountPrincipal is the principal function the README shows: the account
// the authentication found, or an error (401) when it found none.
func accountPrincipal(r *http.Request) (string, error) {
	if acct, ok := r.Context().Value(accountKey{}).(string); ok {
		return acct, nil
	}
	return "", idemserver.ErrNoCredentials
}

// TestCallersDoNotShareKeys is finding 1 of issue 35: Alice's key, sent
// by Bob or by a caller without credentials with the same body, must
// neither get Alice's answer nor run under Alice's record; the
// unauthenticated one stores nothing, so it cannot poison the key.
func TestCallersDoNotShareKeys(t *testing.T) {
	principals := map[string]func(*http.Request) (string, error){
		"auth context": accountPrincipal,
		"credentials":  idemserver.CredentialsPrincipal(),
	}
	for name, principal := range principals {
		t.Run(name, func(t *testing.T) {
			forStores(t, func(t *testing.T, s idemserver.Store) {
				a := &app{answer: func(w http.ResponseWriter, r *http.Request, run int) {
					w.WriteHeader(http.StatusCreated)
					w.Write([]byte("card of " + r.Header.Get("Authorization")))
				}}
				mw := idemserver.New(s, idemserver.WithPrincipal(principal))
				defer mw.Close()
				h := authenticate(mw.Required(a))
				as := func(token string) *httptest.ResponseRecorder {
					hd := http.Header{}
					if token != "" {
						hd.Set("Authorization", "Bearer "+token)
					}
					return do(h, req{key: "order-42", body: `{"amount":100}`, header: hd})
				}
				// The attacker, without credentials, goes first with a guessable key.
				anon := as("")
				assert.Equal(t, http.StatusUnauthorized, anon.Code)
				assert.Equal(t, idemserver.ProblemUnauthorized, problemType(t, anon))
				assert.EqualValues(t, 0, a.runs.Load(), "the handler ran for a caller without credentials")

				alice := as("alice-token")
				require.Equal(t, http.StatusCreated, alice.Code, "Alice's key was poisoned: %s", alice.Body)
				assert.Equal(t, "card of Bearer alice-token", alice.Body.String())

				bob := as("bob-token")
				assert.Equal(t, http.StatusCreated, bob.Code)
				assert.Empty(t, bob.Header().Get(idemserver.ReplayedHeader), "Bob got a replay of Alice's answer")
				assert.Equal(t, "card of Bearer bob-token", bob.Body.String())
				assert.EqualValues(t, 2, a.runs.Load())

				// Bob probing the key with another body learns nothing of Alice's.
				probe := do(h, req{key: "order-42", body: `{"amount":1}`, header: http.Header{"Authorization": {"Bearer bob-token"}}})
				assert.NotContains(t, probe.Body.String(), "alice")

				again := as("alice-token")
				assert.Equal(t, "true", again.Header().Get(idemserver.ReplayedHeader))
				assert.Equal(t, "card of Bearer alice-token", again.Body.String())
				assert.Equal(t, http.StatusUnauthorized, as("").Code)
			})
		})
	}
}

// TestScopeUsesCleanedPath is finding 6 of issue 35: /charge/, //charge
// and /./charge reach the handler of /charge under many routers, so they
// must be the scope of /charge, not new keys.
func TestScopeUsesCleanedPath(t *testing.T) {
	forStores(t, func(t *testing.T, s idemserver.Store) {
		a := &app{}
		mw := idemserver.New(s, idemserver.WithSingleTenant())
		defer mw.Close()
		h := mw.Required(a)
		first := do(h, req{key: "K-1", path: "/charge", body: "100"})
		require.Equal(t, http.StatusCreated, first.Code)
		for _, p := range []string{"/charge/", "//charge", "/./charge", "/x/../charge"} {
			r := httptest.NewRequest(http.MethodPost, "/charge", strings.NewReader("100"))
			r.URL.Path = p // httptest would take "//charge" for a host
			r.Header.Set("Idempotency-Key", "K-1")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			assert.Equal(t, "true", w.Header().Get(idemserver.ReplayedHeader), "path %q ran the handler again", p)
		}
		assert.EqualValues(t, 1, a.runs.Load())
		// Another path is another scope.
		assert.Empty(t, do(h, req{key: "K-1", path: "/charges", body: "100"}).Header().Get(idemserver.ReplayedHeader))
	})
}

// TestCredentialsPrincipal: the digest tells credentials apart, changes
// with a rotated token (the trade-off its doc states) and refuses a
// request without any.
func TestCredentialsPrincipal(t *testing.T) {
	p := idemserver.CredentialsPrincipal("X-Api-Key")
	get := func(v string) (string, error) {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		if v != "" {
			r.Header.Set("X-Api-Key", v)
		}
		return p(r)
	}
	a1, err := get("sk_live_a")
	require.NoError(t, err)
	a2, _ := get("sk_live_a")
	b, _ := get("sk_live_b")
	assert.Equal(t, a1, a2)
	assert.NotEqual(t, a1, b)
	assert.NotContains(t, a1, "sk_live_a", "the principal holds the credential in the clear")
	_, err = get("")
	assert.ErrorIs(t, err, idemserver.ErrNoCredentials)
}
