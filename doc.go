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
// An operation is pending from the moment its key is journaled until the
// caller gets a response (it is then succeeded or failed) or, if the
// outcome stays unknown, until Resume finishes it. Resume never sends an
// operation older than the resend window (23 hours by default, below the
// 24 hours providers keep keys): it reports it as expired instead.
//
// # Guarantees
//
//   - No keyed request leaves the process before its reservation is fsynced;
//     if the journal cannot be written, the request is not sent.
//   - Every attempt, resume and re-drive of an operation carries the same key
//     and body; a key is never sent with another payload (ErrKeyReused).
//   - Only connection failures, timeouts, 408, 425, 429, 500, 502, 503, 504
//     and 409 "in progress" are retried; Retry-After is honoured but capped,
//     and no wait outlasts the caller's context deadline.
//   - Authorization, Cookie, Proxy-Authorization and the headers named with
//     WithSecretHeaders are never written to the journal, and a request's
//     body is deleted once its operation finishes.
//
// # What survives a crash
//
// Every operation whose reservation returned: its key, name, fingerprint
// and replayable request. bbolt commits are atomic, so a crash leaves each
// record either fully written or not at all. Attempt counts and finish
// marks ride the next commit rather than waiting for their own fsync;
// losing one in a crash makes Resume send that operation once more, and the
// server answers from its idempotency store.
//
// The package idemtest provides a reference idempotent server with fault
// injection for testing integrations.
package idem
