package idemtest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"time"
)

// ReplayedHeader is the response header set to "true" on a replayed
// response.
const ReplayedHeader = "Idempotent-Replayed"

// Problem types (RFC 9457 "type" members) of the server's own answers.
const (
	// ProblemMissingKey is the type of the 400 answer to a POST or PATCH
	// without a key (see WithRequireKey).
	ProblemMissingKey = "https://github.com/idemgo/idem/idemtest#missing-key"
	// ProblemInProgress is the type of the 409 answer while an earlier
	// request with the same key is being handled.
	ProblemInProgress = "https://github.com/idemgo/idem/idemtest#in-progress"
	// ProblemKeyMismatch is the type of the 422 answer to a key reused with
	// a different payload.
	ProblemKeyMismatch = "https://github.com/idemgo/idem/idemtest#key-mismatch"
	// ProblemUnavailable is the type of an injected 503 answer.
	ProblemUnavailable = "https://github.com/idemgo/idem/idemtest#unavailable"
	// ProblemTooManyRequests is the type of an injected 429 answer.
	ProblemTooManyRequests = "https://github.com/idemgo/idem/idemtest#too-many-requests"
	// ProblemBodyTooLarge is the type of the 413 answer to a body over
	// MaxBodyBytes.
	ProblemBodyTooLarge = "https://github.com/idemgo/idem/idemtest#body-too-large"
)

// MaxBodyBytes is the largest request body the server reads; a larger one
// gets 413 Content Too Large without being handled.
const MaxBodyBytes = 1 << 20

// Server is a loopback HTTP server that implements the server side of
// draft-ietf-httpapi-idempotency-key-header around a handler, injects
// faults and counts what happened, for tests of idempotent clients.
//
// A request that carries a key (in any method) is handled at most once per
// method, path and key while its result is retained: the first request runs
// the handler and its response is stored unless its status is 5xx; a
// request with the same key and the same payload that arrives while the
// first is running gets 409 Conflict with Retry-After, and one that arrives
// afterwards gets the stored status, headers and body with
// "Idempotent-Replayed: true"; one with a different payload gets 422
// Unprocessable Content. Requests without a key are handled every time,
// unless WithRequireKey turns POST and PATCH without a key away. The
// server's own answers are application/problem+json documents (RFC 9457).
//
// Faults chosen by WithScript or WithFaultRates are applied before all of
// this, except DropAfter, which discards whatever answer was produced.
//
// The handler sees the full request body and writes into a buffer that is
// sent (or dropped) after it returns, so it cannot stream. A Server is safe
// for concurrent use.
type Server struct {
	// URL is the base URL of the form http://ipaddr:port with no trailing
	// slash.
	URL string

	ts      *httptest.Server
	h       http.Handler
	cfg     config
	closing chan struct{} // closed by Close to wake delayed requests
	once    sync.Once

	mu      sync.Mutex
	entries map[scope]*entry
	stored  int // results stored since the last sweep of expired entries
	kept    int // entries left by the last sweep
	stats   Stats
}

// scope identifies a key: the draft scopes keys by resource and operation.
type scope struct {
	method, path, key string
}

// entry is the state of one scoped key: in flight while resp is nil.
type entry struct {
	fingerprint string
	resp        *response
	doneAt      time.Time
}

// response is a complete HTTP answer, small enough to keep.
type response struct {
	status int
	header http.Header
	body   []byte
}

// NewServer starts and returns a Server that wraps h, which performs the
// non-idempotent operation (charge a card, place an order). The caller
// must call Close when finished. NewServer panics if the options are
// invalid.
func NewServer(h http.Handler, opts ...Option) *Server {
	s := &Server{
		h:       h,
		cfg:     newConfig(opts),
		closing: make(chan struct{}),
		entries: make(map[scope]*entry),
		stats:   newStats(),
	}
	s.ts = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.ts.URL
	return s
}

// Client returns an HTTP client configured for the server, with
// keep-alives; Close closes its idle connections.
//
// Note that net/http's Transport itself resends a request that carries an
// Idempotency-Key or X-Idempotency-Key header, once and silently, when a
// reused connection fails before any response arrives (see
// http.Transport). Such resends reach the server and are counted as
// attempts. A client with DisableKeepAlives set never reuses a connection
// and so sees every dropped connection as an error.
func (s *Server) Client() *http.Client { return s.ts.Client() }

// Close wakes requests held by Delay faults, shuts the server down and
// blocks until all requests to it have completed, including handlers still
// running.
func (s *Server) Close() {
	s.once.Do(func() { close(s.closing) })
	s.ts.Close()
}

// Stats returns a snapshot of the server's counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats.clone()
	st.Keys = len(s.entries)
	return st
}

// Fingerprint returns the payload fingerprint the server computes for a
// request: the hex SHA-256 of its method, request target (path and query,
// as in r.URL.RequestURI()) and body. Stats.RunsByPayload is keyed by it.
func Fingerprint(method, target string, body []byte) string {
	h := sha256.New()
	io.WriteString(h, method)
	h.Write([]byte{0})
	io.WriteString(h, target)
	h.Write([]byte{0})
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// serve is the server's root handler.
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	key := requestKey(r.Header.Get(s.cfg.header))

	s.mu.Lock()
	s.stats.Requests++
	s.stats.AttemptsByKey[key]++
	attempt := s.stats.AttemptsByKey[key]
	s.mu.Unlock()

	fault := NoFault
	if s.cfg.script != nil {
		fault = s.cfg.script(key, attempt)
	}
	if fault == NoFault {
		fault = s.cfg.rates.pick(key, attempt)
	}
	if fault != NoFault {
		s.mu.Lock()
		s.stats.Faults[fault]++
		s.mu.Unlock()
	}

	switch fault {
	case DropBefore:
		drop(w)
		return
	case Unavailable:
		problem(http.StatusServiceUnavailable, ProblemUnavailable, "Service unavailable",
			"The server injected a 503 fault; the request was not handled.", "").write(w)
		return
	case TooManyRequests:
		problem(http.StatusTooManyRequests, ProblemTooManyRequests, "Too many requests",
			"The server injected a 429 fault; the request was not handled.", s.retryAfter()).write(w)
		return
	case InProgress:
		s.inProgress().write(w)
		return
	case Delay:
		t := time.NewTimer(s.cfg.delay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return // the client is gone
		case <-s.closing:
			t.Stop()
			drop(w)
			return
		}
	}

	resp := s.handle(r, key)
	if fault == DropAfter {
		drop(w)
		return
	}
	resp.write(w)
}

// handle produces the answer to a request that suffered no fault before
// handling.
func (s *Server) handle(r *http.Request, key string) *response {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil {
		// The client went away mid-body; nobody will read an answer.
		return problem(http.StatusBadRequest, "about:blank", "Bad Request", "reading the request body: "+err.Error(), "")
	}
	if len(body) > MaxBodyBytes {
		return problem(http.StatusRequestEntityTooLarge, ProblemBodyTooLarge, "Request body too large",
			"The request body exceeds "+strconv.Itoa(MaxBodyBytes)+" bytes.", "")
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	fp := Fingerprint(r.Method, r.URL.RequestURI(), body)

	if key == "" {
		if s.cfg.requireKey && (r.Method == http.MethodPost || r.Method == http.MethodPatch) {
			s.mu.Lock()
			s.stats.MissingKeys++
			s.mu.Unlock()
			return problem(http.StatusBadRequest, ProblemMissingKey, "Idempotency-Key is missing",
				"This operation is idempotent and requires a "+s.cfg.header+" header.", "")
		}
		s.mu.Lock()
		s.countRun(key, fp)
		s.mu.Unlock()
		return s.run(r)
	}

	sc := scope{method: r.Method, path: r.URL.Path, key: key}
	now := s.cfg.now()
	s.mu.Lock()
	e := s.entries[sc]
	if e != nil && e.resp != nil && now.Sub(e.doneAt) >= s.cfg.retention {
		delete(s.entries, sc)
		e = nil
	}
	switch {
	case e != nil && e.fingerprint != fp:
		s.stats.Mismatches++
		s.mu.Unlock()
		return problem(http.StatusUnprocessableEntity, ProblemKeyMismatch, "Idempotency-Key is already used",
			"This "+s.cfg.header+" was used with a different payload; a key must not be reused across different payloads.", "")
	case e != nil && e.resp == nil:
		s.stats.Conflicts++
		s.mu.Unlock()
		return s.inProgress()
	case e != nil:
		s.stats.Replays++
		s.mu.Unlock()
		return e.resp.replayed()
	}
	e = &entry{fingerprint: fp}
	s.entries[sc] = e
	s.countRun(key, fp)
	s.mu.Unlock()

	done := false
	defer func() {
		if !done { // the handler panicked: free the key for a retry
			s.mu.Lock()
			delete(s.entries, sc)
			s.mu.Unlock()
		}
	}()
	resp := s.run(r)
	done = true

	s.mu.Lock()
	defer s.mu.Unlock()
	if resp.status >= 500 || s.cfg.retention <= 0 {
		delete(s.entries, sc)
		return resp
	}
	e.resp, e.doneAt = resp, s.cfg.now()
	s.stored++
	if s.stored >= max(s.kept, 64) {
		s.sweep(e.doneAt)
	}
	return resp
}

// countRun records a run of the handler; s.mu must be held.
func (s *Server) countRun(key, fp string) {
	s.stats.Runs++
	s.stats.RunsByKey[key]++
	s.stats.RunsByPayload[fp]++
}

// sweep forgets expired results; s.mu must be held. handle calls it once
// the stores since the last sweep reach what that sweep kept (at least
// 64), so its cost per request stays constant on average and the entries
// held stay below about twice what retention keeps.
func (s *Server) sweep(now time.Time) {
	for sc, e := range s.entries {
		if e.resp != nil && now.Sub(e.doneAt) >= s.cfg.retention {
			delete(s.entries, sc)
		}
	}
	s.stored, s.kept = 0, len(s.entries)
}

// run calls the handler and captures its answer.
func (s *Server) run(r *http.Request) *response {
	rec := &recorder{header: make(http.Header)}
	s.h.ServeHTTP(rec, r)
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	return &response{status: rec.status, header: rec.sent, body: rec.body.Bytes()}
}

func (s *Server) inProgress() *response {
	return problem(http.StatusConflict, ProblemInProgress, "A request is outstanding for this Idempotency-Key",
		"A request with the same "+s.cfg.header+" for the same operation is being processed.", s.retryAfter())
}

// retryAfter returns the Retry-After value in whole seconds, rounded up.
func (s *Server) retryAfter() string {
	return strconv.FormatInt(int64((s.cfg.retryAfter+time.Second-1)/time.Second), 10)
}

// requestKey returns the key in a header value, unquoting the draft's
// sf-string form ("...").
func requestKey(v string) string {
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		return v[1 : len(v)-1]
	}
	return v
}

// problemDoc is an RFC 9457 problem details document.
type problemDoc struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// problem returns a problem+json answer; retryAfter, if not empty, becomes
// the Retry-After header.
func problem(status int, typ, title, detail, retryAfter string) *response {
	body, _ := json.Marshal(problemDoc{Type: typ, Title: title, Status: status, Detail: detail})
	h := http.Header{"Content-Type": {"application/problem+json"}}
	if retryAfter != "" {
		h.Set("Retry-After", retryAfter)
	}
	return &response{status: status, header: h, body: body}
}

// replayed returns a copy of r marked as replayed; r stays untouched so
// that concurrent replays can share it.
func (r *response) replayed() *response {
	h := r.header.Clone()
	h.Set(ReplayedHeader, "true")
	return &response{status: r.status, header: h, body: r.body}
}

func (r *response) write(w http.ResponseWriter) {
	for k, v := range r.header {
		w.Header()[k] = v
	}
	w.WriteHeader(r.status)
	w.Write(r.body)
}

// drop closes the request's connection without an answer, so the client
// sees EOF or a connection reset.
func drop(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler) // the server closes the connection
}

// recorder is the http.ResponseWriter the wrapped handler writes into.
// Like net/http, it takes the header as it stands when the status is
// written; later changes to Header are ignored.
type recorder struct {
	header http.Header
	sent   http.Header // header at WriteHeader time
	status int
	body   bytes.Buffer
}

// Header implements http.ResponseWriter.
func (rec *recorder) Header() http.Header { return rec.header }

// WriteHeader implements http.ResponseWriter.
func (rec *recorder) WriteHeader(status int) {
	if rec.status == 0 && status >= 200 { // informational answers are not kept
		rec.status = status
		rec.sent = rec.header.Clone()
	}
}

// Write implements http.ResponseWriter.
func (rec *recorder) Write(p []byte) (int, error) {
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	return rec.body.Write(p)
}
