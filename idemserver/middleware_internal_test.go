package idemserver

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
)

// The store ids and fingerprints of keys already stored must not change
// with the code that computes them: a changed id forgets a key, and a
// changed fingerprint answers a client's honest retry 422. These are the
// first implementation's, kept as the reference.

func refHashString(d hash.Hash, s string) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(s)))
	d.Write(n[:])
	io.WriteString(d, s)
}

func refFingerprint(r *http.Request, fpHeaders []string, body []byte) string {
	d := sha256.New()
	refHashString(d, r.URL.RawQuery)
	for _, k := range fpHeaders {
		for _, v := range r.Header.Values(k) {
			refHashString(d, k)
			refHashString(d, v)
		}
	}
	refHashString(d, string(body))
	return hex.EncodeToString(d.Sum(nil))
}

func refScopeID(principal, method, path, key string) string {
	d := sha256.New()
	refHashString(d, "idemserver/v1")
	refHashString(d, principal)
	refHashString(d, method)
	refHashString(d, path)
	refHashString(d, key)
	return hex.EncodeToString(d.Sum(nil))
}

// TestFingerprintAndScopeUnchanged serves requests of every shape (query
// or none, fingerprint headers with several values, empty, small, unknown
// length and large bodies, long principals and paths) and checks that the
// id and fingerprint the handler's context holds are the reference's, and
// that the handler reads the body it was sent.
func TestFingerprintAndScopeUnchanged(t *testing.T) {
	long := strings.Repeat("p", 300)
	tests := []struct {
		name, target, principal, body string
		header                        http.Header
		unknownLength                 bool
	}{
		{name: "plain", target: "/orders", body: `{"amount":1}`},
		{name: "empty body", target: "/orders"},
		{name: "query", target: "/orders?currency=eur&x=1", body: "a"},
		{name: "headers", target: "/orders", body: "b",
			header: http.Header{"Content-Type": {"application/json"}, "X-Tenant": {"t1", "t2"}}},
		{name: "unknown length", target: "/orders?q", body: strings.Repeat("c", 3000), unknownLength: true},
		{name: "large", target: "/orders", body: strings.Repeat("d", 70000)},
		{name: "long scope", target: "/" + long + "?" + long, principal: long, body: "e",
			header: http.Header{"X-Tenant": {long}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got keyInfo
			var gotBody string
			next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got, _ = r.Context().Value(keyContext{}).(keyInfo)
				b, _ := io.ReadAll(r.Body)
				gotBody = string(b)
				w.WriteHeader(http.StatusCreated)
			})
			fpHeaders := []string{"Content-Type", "X-Tenant"}
			m := New(NewMemoryStore(), WithSingleTenant(), WithFingerprintHeaders(fpHeaders...),
				WithPrincipal(func(*http.Request) (string, error) { return tt.principal, nil }))
			defer m.Close()
			var body io.Reader = strings.NewReader(tt.body)
			if tt.unknownLength {
				body = io.MultiReader(body)
			}
			r := httptest.NewRequest(http.MethodPost, tt.target, body)
			if tt.unknownLength {
				r.ContentLength = -1
			}
			for k, vs := range tt.header {
				r.Header[k] = vs
			}
			r.Header.Set("Idempotency-Key", "k-1")
			w := httptest.NewRecorder()
			m.Required(next).ServeHTTP(w, r)
			if w.Code != http.StatusCreated {
				t.Fatalf("status %d, body %s", w.Code, w.Body)
			}
			if gotBody != tt.body {
				t.Errorf("handler read %d bytes, want %d", len(gotBody), len(tt.body))
			}
			if want := refFingerprint(r, fpHeaders, []byte(tt.body)); got.fp != want {
				t.Errorf("fingerprint %s, want %s", got.fp, want)
			}
			if want := refScopeID(tt.principal, http.MethodPost, r.URL.Path, "k-1"); got.id != want {
				t.Errorf("scope id %s, want %s", got.id, want)
			}
		})
	}
}

// TestAnnouncedLengthNotAllocated checks that a request announcing a large
// Content-Length but sending a few bytes does not make the middleware
// allocate for the announced length: the buffer grows as bytes arrive.
func TestAnnouncedLengthNotAllocated(t *testing.T) {
	m := New(NewMemoryStore(), WithSingleTenant())
	defer m.Close()
	h := m.Required(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	serve := func(i int) {
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"amount":1}`))
		r.ContentLength = DefaultMaxBodyBytes // announced, never sent
		r.Header.Set("Idempotency-Key", "k-"+strings.Repeat("x", i))
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	serve(0)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const n = 10
	for i := range n {
		serve(i + 1)
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / n; per > DefaultMaxBodyBytes/4 {
		t.Errorf("a request announcing %d bytes and sending 12 allocated %d bytes", DefaultMaxBodyBytes, per)
	}
}
