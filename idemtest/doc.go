// Package idemtest provides a loopback HTTP server for testing clients of
// idempotent APIs, in the spirit of net/http/httptest.
//
// A Server wraps a handler that performs a non-idempotent operation (charge
// a card, place an order) in the server side of
// draft-ietf-httpapi-idempotency-key-header: keys scoped by method, path
// and key; a SHA-256 payload fingerprint; 409 Conflict with Retry-After
// while the first request with a key is in flight; 422 for a key reused
// with another payload; the stored response replayed with
// "Idempotent-Replayed: true"; 5xx results not stored, so a retry runs
// again; results kept for a configurable retention; and optionally 400 for
// a POST or PATCH without a key. Its own errors are RFC 9457
// application/problem+json documents.
//
// On top of that it injects the faults real networks and providers
// produce — a connection dropped before the request is handled, a
// connection dropped after it was handled (the lost response behind double
// charges), delays, 503, 429 and 409 answers — either scripted per key and
// attempt with WithScript or at random, reproducibly from a seed, with
// WithFaultRates. Stats counts requests and handler runs per key and per
// payload, replays and faults, so a test can assert that every operation
// was performed exactly once.
//
// The package does not depend on any particular client; it works with a
// plain http.Client that sets the header by hand.
//
// A typical test:
//
//	srv := idemtest.NewServer(chargeHandler,
//		idemtest.WithFaultRates(idemtest.FaultRates{Seed: 1, DropAfter: 0.2, Unavailable: 0.1}),
//		idemtest.WithRetryAfter(0))
//	defer srv.Close()
//
//	// ... drive the client under test against srv.URL ...
//
//	st := srv.Stats()
//	if n := st.DuplicateKeys(); n != 0 {
//		t.Errorf("%d operations were performed more than once", n)
//	}
package idemtest
