package idemserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"

	"github.com/google/uuid"

	"github.com/idemgo/idem/internal/keys"
)

// keyContext is the context key of the keyInfo of the request being served.
type keyContext struct{}

// keyInfo is what the middleware puts in a handler's context.
type keyInfo struct {
	id  string // scoped store id: principal, method, path and key
	key string // the key as the client sent it
	fp  string // the payload's fingerprint; empty for webhook events
}

// stepNamespace is the UUID namespace of derived keys.
var stepNamespace = uuid.MustParse("5f1d2c8e-8c7a-4e7b-9a51-2f3c6d0e4b19")

// RequestKey returns the idempotency key (or webhook event id) of the
// request a handler serves, as the client sent it, and whether there is
// one.
func RequestKey(ctx context.Context) (string, bool) {
	ki, ok := ctx.Value(keyContext{}).(keyInfo)
	return ki.key, ok
}

// StepKey returns the key derived for the step name of the request a
// handler serves, and whether the context holds such a request. The key
// is a UUID (version 5, SHA-1) of the request's scope (principal, method,
// path), its key, its payload's fingerprint and the step name: the same on
// every replica and on every retry of the request, and different for every
// other principal, route, key, payload or step (so a client key reused
// with another payload after its retention never re-drives the old
// downstream keys).
func StepKey(ctx context.Context, step string) (string, bool) {
	ki, ok := ctx.Value(keyContext{}).(keyInfo)
	if !ok {
		return "", false
	}
	return uuid.NewSHA1(stepNamespace, []byte(ki.id+"\x00"+ki.fp+"\x00"+step)).String(), true
}

// Step returns a context whose outbound requests through an idem client
// carry the key StepKey derives for step, so that a client's retry of the
// request re-drives the very same downstream keys and a provider replays
// instead of charging twice. Give each outbound call of a handler its own
// step name ("charge", "email"). Without a key in ctx (a request that
// passed an Optional route without one), Step returns ctx unchanged and
// idem gives the call a key of its own.
func Step(ctx context.Context, step string) context.Context {
	k, ok := StepKey(ctx, step)
	if !ok {
		return ctx
	}
	return context.WithValue(ctx, keys.Context{}, k) // idem.WithKey(ctx, k)
}

// JSONEventID returns an EventID that reads the string member field of the
// JSON object in the body, such as Stripe's event "id". A body without the
// member, or with null, has no id; a body that is not a JSON object, or a
// member that is not a string, is an error.
func JSONEventID(field string) EventID {
	return func(_ *http.Request, body []byte) (string, error) {
		var doc map[string]json.RawMessage
		if err := json.Unmarshal(body, &doc); err != nil {
			return "", fmt.Errorf("idemserver: webhook body: %w", err)
		}
		raw, ok := doc[field]
		if !ok {
			return "", nil
		}
		var id string
		if err := json.Unmarshal(raw, &id); err != nil {
			return "", fmt.Errorf("idemserver: webhook event id %q: %w", field, err)
		}
		return id, nil
	}
}

// replayContext is the context key of a *replayMark.
type replayContext struct{}

// replayMark records whether the middleware answered a request from a
// stored response.
type replayMark struct{ replayed atomic.Bool }

// TrackReplay returns a context in which IsReplay reports whether the
// middleware answered the request carrying it with a stored response.
// Middleware that runs before idemserver's, such as logging or metrics,
// uses it as Fiber's IsFromCache:
//
//	r = r.WithContext(idemserver.TrackReplay(r.Context()))
//	next.ServeHTTP(w, r)
//	if idemserver.IsReplay(r.Context()) { ... }
//
// The middleware marks a context that has no mark itself, for its
// WithOnReplay functions.
func TrackReplay(ctx context.Context) context.Context {
	if _, ok := ctx.Value(replayContext{}).(*replayMark); ok {
		return ctx
	}
	return context.WithValue(ctx, replayContext{}, new(replayMark))
}

// IsReplay reports whether the request of ctx, a context made by
// TrackReplay (or one derived from it), was answered from a stored
// response: a replay, or a "done, not kept" answer. It is false in the
// handler, which a replay does not run.
func IsReplay(ctx context.Context) bool {
	m, ok := ctx.Value(replayContext{}).(*replayMark)
	return ok && m.replayed.Load()
}
