// Package idem makes non-idempotent HTTP calls (payments, orders, bookings)
// safe to retry.
//
// Its Transport, an http.RoundTripper, gives every logical operation an
// Idempotency-Key, writes the key, a fingerprint of the payload and the
// replayable request durably to a journal before the first byte is sent,
// retries only transient failures with the same key and a byte-identical
// body, and leaves every operation whose outcome is unknown pending in the
// journal so that Client.Resume can finish it after a crash.
package idem
