// Package idemserver is the server side of idem: net/http middleware that
// makes handlers idempotent by key, following
// draft-ietf-httpapi-idempotency-key-header, and deduplicates inbound
// webhooks by event id.
//
//	store, err := idemserver.OpenBoltStore("/var/lib/bff/keys.db", nil)
//	...
//	mw := idemserver.New(store, idemserver.WithPrincipal(accountID))
//	mux.Handle("POST /v1/orders", auth(mw.Required(orders)))
//
// where accountID returns the account the application's authentication
// (auth) put in the request's context. A request's key is scoped by that
// principal, the method and the cleaned path; Required and Optional panic
// for a middleware with no principal function unless WithSingleTenant
// says the service has one tenant. Inbound webhooks are verified before
// their event id counts (WithWebhookVerify):
//
//	hooks := idemserver.New(store, idemserver.WithWebhookVerify(idemserver.StandardWebhooks(secret, 0)))
//	mux.Handle("POST /hooks/psp", hooks.Webhook(pspEvents, nil))
//
// The first request with a key runs the handler under
// a lease on the key; a concurrent one gets 409 with Retry-After; a later
// one gets the stored response with "Idempotent-Replayed: true"; one with
// another payload gets 422. 5xx, 408, 425 and 429 answers and panics are
// not stored, so the client may retry; an answer that cannot be stored is never sent as a
// 2xx (503 instead), and one too large to keep leaves a "done, not kept"
// record rather than a second run. Safe methods pass through. See
// Middleware for the whole contract.
//
// Inside a handler, Step derives the keys of outbound calls made through
// an idem client from the request's key, so the client's retry re-drives
// the very same downstream operations:
//
//	resp, err := psp.Do(req.WithContext(idemserver.Step(r.Context(), "charge")))
//
// Stores implement Store; MemoryStore and BoltStore come with the package,
// and the storetest package holds the conformance suite every Store must
// pass. Both are LocalStores: they hold a key while its handler runs in
// this process, whatever the clock says, so that a process paused past its
// lease cannot run a handler twice. A store that also implements TxStore (pgstore.ServerStore) lets a
// handler write its own rows in the transaction that stores its answer
// (pgstore.Tx), so that the two commit or vanish together.
package idemserver
