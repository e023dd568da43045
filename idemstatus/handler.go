package idemstatus

import (
	"context"
	"encoding/json"
	"errors"
	"html/template"
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
	// Operations are the first pending operations, in key order.
	Operations []Op `json:"operations"`
}

// Op is a pending operation as the page shows it: no header values, no
// body, no URL query.
type Op struct {
	Key        string    `json:"key"`
	Name       string    `json:"name,omitempty"`
	Method     string    `json:"method,omitempty"`
	URL        string    `json:"url,omitempty"`
	Created    time.Time `json:"created"`
	AgeSeconds float64   `json:"age_seconds"`
	Attempts   int       `json:"attempts"`
	LastStatus int       `json:"last_status,omitempty"`
	LastError  string    `json:"last_error,omitempty"`
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
}

// Handler returns a handler that shows the pending operations of j and the
// counters and recent operations of c; either may be nil. It answers GET
// and HEAD with an HTML page, or with JSON (Status) when the request has
// ?format=json or accepts application/json but not text/html. ?limit=N
// sets how many pending operations are listed (DefaultLimit, at most
// MaxLimit).
func Handler(j Journal, c *Collector) http.Handler {
	return &handler{j: j, c: c, now: time.Now}
}

type handler struct {
	j   Journal
	c   *Collector
	now func() time.Time
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
	st := h.status(r.Context(), limit)
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
	_ = page.Execute(w, st)
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
func (h *handler) status(ctx context.Context, limit int) Status {
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
	p, err := readPending(ctx, h.j, now, limit)
	st.Pending = p
	if err != nil {
		st.Error = err.Error()
	}
	return st
}

// readPending walks up to MaxWalk pending operations of j, counting them
// and keeping the first limit.
func readPending(ctx context.Context, j Journal, now time.Time, limit int) (*Pending, error) {
	p := &Pending{Operations: []Op{}}
	var (
		errs   []error
		oldest time.Time
	)
	for after, seen := "", 0; ; {
		page, err := j.Pending(ctx, after, walkPage)
		if err != nil {
			errs = append(errs, err)
			if len(page) == 0 {
				break
			}
		}
		if len(page) == 0 {
			break
		}
		for _, rec := range page {
			if seen == MaxWalk {
				p.Truncated = true
				break
			}
			seen++
			op := view(rec, now)
			p.Count++
			switch {
			case op.Unreadable:
				p.Unreadable++
			case op.InFlight:
				p.InFlight++
			default:
				p.InDoubt++
				if oldest.IsZero() || rec.Created.Before(oldest) {
					oldest = rec.Created
				}
			}
			if len(p.Operations) < limit {
				p.Operations = append(p.Operations, op)
			}
		}
		if p.Truncated || len(page) < walkPage {
			break
		}
		after = page[len(page)-1].Key
	}
	if !oldest.IsZero() {
		p.OldestInDoubt = &oldest
		p.OldestInDoubtAge = max(now.Sub(oldest), 0).Seconds()
	}
	return p, errors.Join(errs...)
}

// view is how the page shows rec.
func view(rec idem.Operation, now time.Time) Op {
	return Op{
		Key: rec.Key, Name: rec.Name, Method: rec.Method, URL: withoutQuery(rec.URL),
		Created: rec.Created, AgeSeconds: max(now.Sub(rec.Created), 0).Seconds(),
		Attempts: rec.Attempts, LastStatus: rec.LastStatus, LastError: rec.LastError,
		InFlight: rec.State == idem.StatePending && rec.Owner != "" && rec.LeaseUntil.After(now),
		Owner:    rec.Owner, LeaseUntil: rec.LeaseUntil,
		Redacted: rec.Redacted, Unreplayable: rec.Unreplayable,
		Unreadable: rec.State == 0,
	}
}

var page = template.Must(template.New("idem").Funcs(template.FuncMap{
	"age": func(seconds float64) string {
		return (time.Duration(seconds * float64(time.Second))).Round(time.Second).String()
	},
	"total": Total,
	"ts":    func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
}).Parse(`<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>idem</title>
<style>body{font-family:sans-serif;margin:1em}table{border-collapse:collapse;margin-bottom:1em}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left;font-size:90%}th{background:#eee}.bad{color:#a00}</style>
</head><body>
<h1>idem</h1>
<p>As of {{ts .Time}}. <a href="?format=json">JSON</a></p>
{{with .Error}}<p class="bad">Journal: {{.}}</p>{{end}}
{{with .Pending}}
<h2>Pending: {{.Count}}{{if .Truncated}}+{{end}}</h2>
<p>{{.InFlight}} in flight, {{.InDoubt}} in doubt{{if .Unreadable}}, <span class="bad">{{.Unreadable}} unreadable</span>{{end}}.{{if .OldestInDoubt}} Oldest in doubt: {{age .OldestInDoubtAge}} old (created {{ts .OldestInDoubt}}).{{end}}</p>
{{if .Operations}}<table id="pending">
<tr><th>key</th><th>name</th><th>method</th><th>url</th><th>age</th><th>attempts</th><th>last</th><th>status</th></tr>
{{range .Operations}}<tr><td>{{.Key}}</td><td>{{.Name}}</td><td>{{.Method}}</td><td>{{.URL}}</td><td>{{age .AgeSeconds}}</td><td>{{.Attempts}}</td><td>{{if .LastStatus}}{{.LastStatus}} {{end}}{{.LastError}}</td><td>{{if .Unreadable}}<span class="bad">unreadable</span>{{else if .InFlight}}in flight ({{.Owner}}){{else}}in doubt{{end}}{{if .Redacted}}, needs credentials{{end}}{{if .Unreplayable}}, body not journaled{{end}}</td></tr>
{{end}}</table>{{end}}
{{end}}
{{with .Counts}}
<h2>Counters</h2>
<table id="counters">
<tr><th>attempts</th><td>{{total .Attempts}}</td></tr>
<tr><th>retries</th><td>{{total .Retries}}</td></tr>
<tr><th>settled</th><td>{{total .Settled}}</td></tr>
<tr><th>in doubt</th><td>{{.InDoubt}}</td></tr>
<tr><th>resumed</th><td>{{.Resumed}}</td></tr>
<tr><th>expired</th><td>{{.Expired}}</td></tr>
</table>
<table id="reasons"><tr><th>attempt outcome</th><th>attempts</th><th>retries</th></tr>
{{$r := .Retries}}{{range $reason, $n := .Attempts}}<tr><td>{{$reason}}</td><td>{{$n}}</td><td>{{index $r $reason}}</td></tr>
{{end}}</table>
{{end}}
{{if .Recent}}
<h2>Recent</h2>
<table id="recent"><tr><th>time</th><th>event</th><th>key</th><th>name</th><th>method</th><th>url</th><th>state</th><th>attempts</th><th>status / error</th></tr>
{{range .Recent}}<tr><td>{{ts .Time}}</td><td>{{.Kind}}</td><td>{{.Key}}</td><td>{{.Name}}</td><td>{{.Method}}</td><td>{{.URL}}</td><td>{{.State}}</td><td>{{.Attempts}}</td><td>{{if .Status}}{{.Status}} {{end}}{{.Err}}</td></tr>
{{end}}</table>
{{end}}
</body></html>
`))
