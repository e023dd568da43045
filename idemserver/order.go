package idemserver

import (
	"context"
	"io"
	"net/http"
	"strconv"
)

// StaleEventHeader is the response header set to "true" when a Webhook
// route ordered with WithOrder answered an event without running its
// handler because a newer version of its entity was applied first.
const StaleEventHeader = "Idem-Stale-Event"

// EventVersion returns the entity an inbound webhook event is about (a
// payment id, an order id) and the event's version (a sequence number, an
// updated-at in Unix nanoseconds), given the request and its whole body.
// An entity of "" means the event is not ordered and its handler runs; an
// error means the event is malformed, and it is answered 400.
type EventVersion func(r *http.Request, body []byte) (entity string, version int64, err error)

// An Advancer records, in the transaction of the request ctx belongs to,
// version as the newest applied to entity in scope if it is newer than the
// one recorded, and reports whether it did. Recording in the request's
// transaction is what makes ordering exact: the version, the handler's
// writes and the stored answer commit together, so a handler that fails
// leaves the version where it was. pgstore's ServerStore gives one
// (ServerStore.RequestAdvancer, which calls ServerStore.Advance with
// pgstore.Tx's transaction). An Advancer that writes outside the request's
// transaction still orders events, but a handler that fails after it
// returned true leaves the entity advanced to a version that was never
// applied.
type Advancer interface {
	Advance(ctx context.Context, scope, entity string, version int64) (applied bool, err error)
}

// A WebhookOption configures one Webhook route: Middleware.Webhook takes
// them after the EventID (WithOrder).
type WebhookOption func(*webhookConfig)

type webhookConfig struct {
	order *ordering
}

// ordering is a WithOrder route's setting.
type ordering struct {
	scope   string
	adv     Advancer
	version EventVersion
}

// WithOrder makes a Webhook route apply each entity's events in version
// order: after the event id is claimed and before the handler runs, it
// reads the event's entity and version with version and records them with
// adv in scope (a name of the sender's event stream, "psp-payments"). An
// event whose version is not newer than the one applied is stale: it is
// answered 200 with StaleEventHeader "true", without running the handler,
// and that answer is stored for its id like any other; so an older
// "payment pending" that arrives after "payment succeeded" never moves the
// payment back. An Advancer error answers 503, which releases the id for
// the sender's retry. With a nil adv or version the option does nothing.
func WithOrder(scope string, adv Advancer, version EventVersion) WebhookOption {
	return func(c *webhookConfig) {
		if adv != nil && version != nil {
			c.order = &ordering{scope: scope, adv: adv, version: version}
		}
	}
}

// webhookHandler returns h with the route's options applied.
func (m *Middleware) webhookHandler(h http.Handler, opts []WebhookOption) http.Handler {
	var c webhookConfig
	for _, o := range opts {
		o(&c)
	}
	if c.order != nil {
		h = &orderedHandler{h: h, o: *c.order, cfg: &m.cfg}
	}
	return h
}

// orderedHandler runs h only for events newer than their entity's last.
type orderedHandler struct {
	h   http.Handler
	o   ordering
	cfg *config
}

func (oh *orderedHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, ProblemBadRequest, "Bad Request", "The request body could not be read.", 0)
		return
	}
	r.Body = newBodyReader(body)
	entity, version, err := oh.o.version(r, body)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, ProblemBadRequest, "Webhook event version is invalid",
			"The delivery's entity or version could not be read: "+err.Error(), 0)
		return
	}
	r.Body = newBodyReader(body) // for the handler, whatever version read
	if entity == "" {
		oh.h.ServeHTTP(w, r)
		return
	}
	applied, err := oh.o.adv.Advance(r.Context(), oh.o.scope, entity, version)
	if err != nil {
		oh.cfg.logger.Error("idemserver: event version not recorded; event refused", "scope", oh.o.scope, "entity", entity, "version", version, "err", err)
		writeProblem(w, http.StatusServiceUnavailable, ProblemUnavailable, "Service unavailable",
			"The event's version could not be recorded; the event was not handled.", oh.cfg.retryAfter)
		return
	}
	if !applied {
		oh.cfg.logger.Debug("idemserver: stale event answered without running the handler", "scope", oh.o.scope, "entity", entity, "version", version)
		w.Header().Set(StaleEventHeader, "true")
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "stale event: version "+strconv.FormatInt(version, 10)+" of "+entity+" is not newer than the one applied\n")
		return
	}
	oh.h.ServeHTTP(w, r)
}
