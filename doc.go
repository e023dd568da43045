// Package idem makes non-idempotent HTTP calls (payments, orders, bookings)
// safe to retry.
//
// A timeout does not prove that a payment failed: the provider may have
// charged the card and lost only the response. idem's Transport, an
// http.RoundTripper, gives every logical operation an Idempotency-Key,
// writes the key, a fingerprint of the payload and the replayable request
// durably to a journal before the first byte is sent, retries only
// transient failures with the same key and a byte-identical body, and
// leaves every operation whose outcome is unknown pending in the journal so
// that Client.Resume can finish it after a crash, with its original key.
//
// # Lifecycle
//
//	client, err := idem.Open("/var/lib/app/idem.db") // bbolt journal, 0600
//	defer client.Close()
//	client.Resume(ctx, handle)  // finish what a crash interrupted
//	hc := client.HTTPClient()   // give it to your code or SDK
//	ctx = idem.WithOperation(ctx, "pay:order-42") // a key that survives restarts
//	resp, err := hc.Do(req.WithContext(ctx))
//
// An operation is pending from the moment its key is journaled. It is
// settled (succeeded or failed) once its caller received the answer: the
// response body was read to its end or closed. It stays pending, in doubt,
// when the caller got only an error after a request may have gone out, or
// a response whose body could not be read; Resume finishes it, and so does a
// re-drive by the same name or key. A request that was never sent leaves
// nothing pending. Resume never sends an operation older than the resend
// window (23 hours by default, below the 24 hours providers keep keys): it
// reports it as expired instead.
//
// # Every caller
//
// Callers retry too. Within one process, a call with no key of its own that
// is the same call as one that ended, within a minute, without a definite
// answer its caller received (same method, URL, body, every header but the
// volatile ones, and the same principal) reuses that call's key: an SDK's
// retry loop (openai-go, anthropic-sdk-go) is one operation. Only a
// definite answer delivered to a live caller ends that match; a Resume
// that finished the operation does not. Calls of one key or name at once
// take turns: the later ones wait, bounded by their context, and then
// re-drive the key, getting the server's stored answer.
//
// Matching does not reach other processes, nor a second identical call
// made while the first is in flight or after its answer (a double tap):
// those are stopped by keys the application supplies (WithOperation, or
// the server side's keys). A backend whose provider calls do not identify
// the end user must name its operations, name the principal
// (WithPrincipal), or turn matching off (WithResendMatchWindow(0)).
//
// # Guarantees
//
//   - No keyed request leaves the process before its reservation is durable;
//     if the journal cannot be written, the request is not sent.
//   - Every attempt, resume and re-drive of an operation carries the same key
//     and body; a key is never sent with another payload (ErrKeyReused).
//   - Only connection failures, timeouts, 408, 425, 429, 500, 502, 503, 504,
//     529 and 409 "in progress" are retried, unless the server says
//     otherwise (Stripe-Should-Retry, X-Should-Retry); Retry-After and
//     Retry-After-Ms are honoured but capped, and no wait outlasts the
//     caller's context deadline.
//   - Credentials (DefaultSecretHeaders: Authorization, Cookie,
//     X-Api-Key and the like, the headers named with WithSecretHeaders,
//     the URL's user info and secret query parameters) are never written
//     to the journal, nor sent on a redirect to another host; Resume sends
//     such an operation only through WithResumePrepare. A request's body is deleted
//     once its operation finishes, and its URL loses its query.
//
// # What survives a crash
//
// Every operation whose reservation returned: its key, name, fingerprint
// and replayable request. bbolt commits are atomic, so a crash leaves each
// record either fully written or not at all. Attempt counts and finish
// marks ride the next commit rather than waiting for their own fsync; a
// crash in the milliseconds before that commit makes Resume send that
// operation once more and deliver it to its handler although its caller had
// the answer: the server replays it, and the handler reconciles by key.
// Close waits for the calls in flight and makes every mark durable.
//
// # Fleets and the server side
//
// The journal is a KeyStore: the bbolt file (Open, package boltjournal),
// the memory store, the PostgreSQL store of module
// github.com/idemgo/idem/pgstore for replicas that share one journal, or
// your own; the contract is package idemstore's (for store authors: this
// package's KeyStore, Operation and the like are aliases of its names),
// and package storetest checks any store against it. Package idemserver is the server half: middleware
// that makes handlers idempotent for the keys your clients send.
//
// The package idemtest provides a reference idempotent server with fault
// injection for testing integrations.
package idem
