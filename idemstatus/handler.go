package idemstatus

import (
	"context"
	"encoding/json"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemgo/idem"
)

// Journal is what the page reads of a journal. Every idem.KeyStore is one.
type Journal interface {
	Pending(ctx context.Context, after string, limit int) ([]idem.Operation, error)
}

// Limits of the page.
const (
	// DefaultLimit is how many pending operations the page lists unless
	// the request asks for another number with ?limit=N.
	DefaultLimit = 100
	// MaxLimit caps ?limit=.
	MaxLimit = 1000
	// MaxWalk caps how many pending operations one request reads to count
	// them and find the oldest in doubt; beyond it the counts are marked
	// truncated.
	MaxWalk = 100_000

	walkPage = 500
)

// Status is what the page shows; its JSON form is the page's JSON answer.
type Status struct {
	// Time is when the status was taken.
	Time time.Time `json:"time"`
	// Pending describes the operations pending in the journal. It is nil
	// when the handler has no journal.
	Pending *Pending `json:"pending,omitempty"`
	// Counts are the Collector's counters; nil without a Collector.
	Counts *Counts `json:"counts,omitempty"`
	// Recent are the operations that ended last, newest first.
	Recent []Event `json:"recent,omitempty"`
	// Error says why the journal could not be read (completely), or "".
	Error string `json:"error,omitempty"`
}

// Pending describes the pending operations.
type Pending struct {
	// Count is how many operations are pending, InFlight how many of them
	// are under a live lease (being sent by a call or a Resume), InDoubt
	// how many are not (waiting for Resume or a re-drive), and Unreadable
	// how many records could not be read.
	Count      int `json:"count"`
	InFlight   int `json:"in_flight"`
	InDoubt    int `json:"in_doubt"`
	Unreadable int `json:"unreadable"`
	// OldestInDoubt is when the oldest operation in doubt was created, and
	// OldestInDoubtAge its age in seconds; both are absent when none is in
	// doubt.
	OldestInDoubt    *time.Time `json:"oldest_in_doubt,omitempty"`
	OldestInDoubtAge float64    `json:"oldest_in_doubt_age_seconds,omitempty"`
	// Truncated reports that there were more than MaxWalk pending
	// operations: the counts cover the first MaxWalk only.
	Truncated bool `json:"truncated,omitempty"`
	// Operations are one page of the pending operations, in key order:
	// the first ones after the key After ("" for the first page).
	Operations []Op `json:"operations"`
	// After is the page's cursor (?after=), Before how many pending
	// operations come before the page, More whether more come after it,
	// and Next the cursor of the next page ("" when none).
	After  string `json:"after,omitempty"`
	Before int    `json:"before"`
	More   bool   `json:"more,omitempty"`
	Next   string `json:"next,omitempty"`
}

// From and To number the page's first and last operation, from 1 (both 0
// for an empty page).
func (p *Pending) From() int {
	if len(p.Operations) == 0 {
		return 0
	}
	return p.Before + 1
}

// To numbers the page's last operation (see From).
func (p *Pending) To() int { return p.Before + len(p.Operations) }

// Op is a pending operation as the page shows it: no header values, no
// body, no URL query.
type Op struct {
	Key        string    `json:"key"`
	Name       string    `json:"name,omitempty"`
	Method     string    `json:"method,omitempty"`
	URL        string    `json:"url,omitempty"`
	Created    time.Time `json:"created"`
	AgeSeconds float64   `json:"age_seconds"`
	// Attempts counts the requests written under the key, each counted
	// when it started (idem.Operation.Attempts): for an operation in
	// flight, the one under way included, or the Collector's count when
	// it has a newer one.
	Attempts   int    `json:"attempts"`
	LastStatus int    `json:"last_status,omitempty"`
	LastError  string `json:"last_error,omitempty"`
	// InFlight reports a live lease: a call or Resume is sending it.
	InFlight   bool      `json:"in_flight"`
	Owner      string    `json:"owner,omitempty"`
	LeaseUntil time.Time `json:"lease_until,omitzero"`
	// Redacted reports that a resend needs WithResumePrepare to add
	// credentials; Unreplayable that its body was not journaled.
	Redacted     bool `json:"redacted,omitempty"`
	Unreplayable bool `json:"unreplayable,omitempty"`
	// Unreadable reports a record the journal could not read; LastError
	// says why.
	Unreadable bool `json:"unreadable,omitempty"`
	// NeedsCredentials reports that a resend needs credentials the
	// application does not add back (Redacted, and the handler was not
	// told WithResumePrepare).
	NeedsCredentials bool `json:"needs_credentials,omitempty"`
	// Why says in words why the operation is pending, and Do what the
	// operator can do about it.
	Why string `json:"why"`
	Do  string `json:"do"`
}

// Option configures a Handler.
type Option func(*handler)

// WithResumePrepare tells the handler that the application resends
// credentials itself (its Client has an idem.WithResumePrepare hook), so
// operations journaled without them are resumable by the application and
// are not marked "needs credentials".
func WithResumePrepare() Option { return func(h *handler) { h.credentials = true } }

// Handler returns a handler that shows the pending operations of j and the
// counters and recent operations of c; either may be nil. It answers GET
// and HEAD with an HTML page, or with JSON (Status) when the request has
// ?format=json or accepts application/json but not text/html. ?limit=N
// sets how many pending operations are listed (DefaultLimit, at most
// MaxLimit) and ?after=KEY where the page starts (the Next of the page
// before); the page says which ones it shows of how many.
func Handler(j Journal, c *Collector, opts ...Option) http.Handler {
	h := &handler{j: j, c: c, now: time.Now}
	for _, o := range opts {
		if o != nil {
			o(h)
		}
	}
	return h
}

type handler struct {
	j           Journal
	c           *Collector
	now         func() time.Time
	credentials bool
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	limit := DefaultLimit
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			http.Error(w, "limit must be a number >= 0", http.StatusBadRequest)
			return
		}
		limit = min(n, MaxLimit)
	}
	st := h.status(r.Context(), r.URL.Query().Get("after"), limit)
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if wantsJSON(r) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(st)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_ = page.Execute(w, pageData{Status: st, Limit: limit, MaxWalk: MaxWalk})
}

// wantsJSON reports whether r asks for JSON rather than HTML.
func wantsJSON(r *http.Request) bool {
	switch r.URL.Query().Get("format") {
	case "json":
		return true
	case "html":
		return false
	}
	json, html := false, false
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		mt, _, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		switch mt {
		case "application/json":
			json = true
		case "text/html":
			html = true
		}
	}
	return json && !html
}

// status reads the journal and the collector.
func (h *handler) status(ctx context.Context, after string, limit int) Status {
	now := h.now()
	st := Status{Time: now}
	if h.c != nil {
		counts := h.c.Counts()
		st.Counts = &counts
		st.Recent = h.c.Recent()
	}
	if h.j == nil {
		return st
	}
	p, err := readPending(ctx, h.j, now, after, limit)
	for i := range p.Operations {
		op := &p.Operations[i]
		if l, ok := h.live(op.Key); ok && op.InFlight && l.Attempts > op.Attempts {
			op.Attempts, op.LastStatus = l.Attempts, l.Status
			if l.Status == 0 && l.Reason != "" {
				op.LastError = l.Reason
			}
		}
		advise(op, h.credentials)
	}
	st.Pending = p
	if err != nil {
		st.Error = err.Error()
	}
	return st
}

// live returns what the Collector saw of the operation with key.
func (h *handler) live(key string) (LiveOp, bool) {
	if h.c == nil {
		return LiveOp{}, false
	}
	return h.c.Live(key)
}
