package idem

import (
	"cmp"
	"container/list"
	"crypto/sha256"
	"encoding/binary"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// recentCalls remembers, for the match window, the calls that ended
// without a definite answer their live caller received (in doubt, or with
// a transient status), by match key (see matchKey): a caller's resend of
// the same call (an SDK's own retry loop) reuses their key instead of
// getting a new one.
//
// Inside its window it forgets nothing until it holds limit calls; beyond
// that the oldest entry goes first, each eviction is counted, and the
// first one is logged. Entries are kept in the order they were last
// added, so both the window's pruning and eviction take from the front.
type recentCalls struct {
	mu      sync.Mutex
	window  time.Duration
	limit   int
	log     *slog.Logger
	entries map[[32]byte]*list.Element // of *recentCall
	order   list.List                  // oldest first
	evicted atomic.Uint64
	warned  bool
}

type recentCall struct {
	mk  [32]byte
	key string
	at  time.Time
}

// add remembers that the call with match key mk ended under key without a
// definite answer for its caller, now.
func (r *recentCalls) add(mk [32]byte, key string) {
	if r.window <= 0 || mk == ([32]byte{}) {
		return
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.entries == nil {
		r.entries = make(map[[32]byte]*list.Element)
	}
	r.pruneLocked(now)
	if el, ok := r.entries[mk]; ok {
		e := el.Value.(*recentCall)
		e.key, e.at = key, now
		r.order.MoveToBack(el)
		return
	}
	limit := r.limit
	if limit <= 0 {
		limit = DefaultResendMatchLimit
	}
	for len(r.entries) >= limit {
		r.removeLocked(r.order.Front())
		r.evicted.Add(1)
		if !r.warned && r.log != nil {
			r.warned = true
			r.log.Warn("idem: resend match index is full; the oldest calls in doubt are forgotten, so their resends get new keys (raise WithResendMatchLimit)",
				"idem.match_limit", limit, "idem.match_window", r.window)
		}
	}
	r.entries[mk] = r.order.PushBack(&recentCall{mk: mk, key: key, at: now})
}

// pruneLocked drops the entries older than the window, from the front.
func (r *recentCalls) pruneLocked(now time.Time) {
	for el := r.order.Front(); el != nil; el = r.order.Front() {
		if now.Sub(el.Value.(*recentCall).at) <= r.window {
			return
		}
		r.removeLocked(el)
	}
}

func (r *recentCalls) removeLocked(el *list.Element) {
	delete(r.entries, el.Value.(*recentCall).mk)
	r.order.Remove(el)
}

// forget ends the match of the call with match key mk, if it still points
// to key: its live caller received a definite answer.
func (r *recentCalls) forget(mk [32]byte, key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if el, ok := r.entries[mk]; ok && el.Value.(*recentCall).key == key {
		r.removeLocked(el)
	}
}

// match returns the key of a recent call with match key mk.
func (r *recentCalls) match(mk [32]byte) (string, bool) {
	if mk == ([32]byte{}) {
		return "", false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	el, ok := r.entries[mk]
	if !ok {
		return "", false
	}
	e := el.Value.(*recentCall)
	if time.Since(e.at) > r.window {
		return "", false
	}
	return e.key, true
}

// stats returns how many calls the index holds and how many it evicted.
func (r *recentCalls) stats() ResendMatchStats {
	r.mu.Lock()
	n := len(r.entries)
	r.mu.Unlock()
	return ResendMatchStats{Held: n, Evicted: r.evicted.Load()}
}

// ResendMatchStats describes the index of recent calls that resend
// matching keeps in memory (see WithResendMatchLimit).
type ResendMatchStats struct {
	// Held is how many calls without a definite answer the index holds,
	// some possibly past the window and not yet pruned.
	Held int
	// Evicted counts the calls forgotten inside their window because the
	// index was full: a resend of one of them got a new key. Export it
	// as a counter; anything above zero means the limit is too low for
	// the number of calls in doubt per window.
	Evicted uint64
}

// ResendMatchStats returns the state of the resend match index, for a
// metric.
func (c *Client) ResendMatchStats() ResendMatchStats { return c.t.j.recent.stats() }

// What identifies a call for resend matching: its method, URL and body
// (the payload fingerprint), every header except the volatile ones below
// and the credentials, and the principal it acts for (the credentials'
// digest, or what WithPrincipal names). Two calls that differ in any of
// them, a tenant header such as Stripe-Account or OpenAI-Organization
// included, are never matched.

// defaultVolatile are the headers that may differ between the resends of
// one call without making it another call. Each is here because a client
// sets it per attempt, not per payload; WithVolatileHeaders adds more.
var defaultVolatile = []string{
	// Retry counters: the only mark openai-go and anthropic-sdk-go put on
	// their own retries; a counter is what makes a resend a resend.
	"X-Stainless-Retry-Count",
	// Other retry counters and attempt marks: generic ones of hand-written
	// retry loops; the AWS SDKs' attempt number and per-invocation id; the
	// Google client libraries' header, which carries an invocation id and
	// an attempt count.
	"X-Retry-Count", "X-Retry-Attempt", "Amz-Sdk-Request", "Amz-Sdk-Invocation-Id", "X-Goog-Api-Client",
	// The Stainless SDKs' per-request timeout: a client setting, shrunk by
	// some SDKs as the call's deadline nears, never the payload.
	"X-Stainless-Timeout",
	// stripe-go's telemetry: the previous request's id and duration.
	"X-Stripe-Client-Telemetry",
	// W3C trace context and baggage: a new span (and parent id) per
	// attempt; baggage travels with the trace, not the payload.
	"Traceparent", "Tracestate", "Baggage",
	// Other tracers' per-attempt span and trace ids (Zipkin B3, Datadog,
	// AWS X-Ray, Google Cloud, Jaeger, Sentry).
	"B3", "X-B3-Traceid", "X-B3-Spanid", "X-B3-Parentspanid", "X-B3-Sampled", "X-B3-Flags",
	"X-Datadog-Trace-Id", "X-Datadog-Parent-Id", "X-Datadog-Sampling-Priority", "X-Datadog-Origin",
	"X-Amzn-Trace-Id", "X-Cloud-Trace-Context", "Uber-Trace-Id", "Sentry-Trace",
	// Dates: the time of sending, which a retry changes by definition;
	// X-Amz-Date is the date of an AWS SigV4 signature.
	"Date", "X-Amz-Date",
	// Request ids: minted per HTTP request by clients and proxies, so a
	// retry carries a new one.
	"X-Request-Id", "Request-Id", "X-Correlation-Id",
	// The client software's name and version: it says who sends, not what,
	// and some clients add the attempt or a timestamp.
	"User-Agent",
	// Hop-by-hop and framing headers: they describe the connection or the
	// body's length (the body itself is fingerprinted), not the payload.
	"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length", "Expect",
}

// matchKey returns the key under which recentCalls knows a call: the
// payload's fingerprint fp, the call's other headers but the volatile ones,
// the key header and the secret ones, and its principal: the application's
// name for it (WithPrincipal) or else a digest of its credentials (secret
// headers, the URL's user info and secret query parameters), so that the
// same payload sent for another tenant or account is never taken for a
// resend. It stays in memory. It is zero when matching is off.
func (c *config) matchKey(fp [32]byte, req *http.Request) [32]byte {
	if c.matchWindow <= 0 {
		return [32]byte{}
	}
	var space [512]byte
	b := append(space[:0], fp[:]...)
	// Header names as sent, with their canonical form (computed once, not
	// in every comparison), sorted: maps iterate at random.
	// The same walk collects the secret headers, for appendCredentials.
	type name struct{ canon, sent string }
	var buf [24]name
	names := buf[:0]
	var credSpace [8]credential
	creds := credSpace[:0]
	for k, vs := range req.Header {
		switch ck := http.CanonicalHeaderKey(k); {
		case c.isSecretHeader(ck):
			creds = headerCredentials(creds, ck, vs)
		case !c.volatile[ck] && ck != c.header:
			names = append(names, name{ck, k})
		}
	}
	slices.SortFunc(names, func(a, b name) int {
		if c := strings.Compare(a.canon, b.canon); c != 0 {
			return c
		}
		return strings.Compare(a.sent, b.sent)
	})
	for _, n := range names {
		b = appendString(b, 'h', n.canon)
		for _, v := range req.Header[n.sent] {
			b = appendString(b, 'v', v)
		}
	}
	if c.principal != nil {
		if p := c.principal(req); p != "" {
			return sha256.Sum256(appendString(b, 'p', p))
		}
	}
	return sha256.Sum256(c.appendCredentials(b, req, creds))
}

// headerCredentials appends to creds the values of the secret header ck.
func headerCredentials(creds []credential, ck string, vs []string) []credential {
	for _, v := range vs {
		creds = append(creds, credential{'h', ck, v, true})
	}
	return creds
}

// appendCredentials appends to b the credentials of req: creds, its
// secret headers (collected by the caller's walk of the header, see
// headerCredentials), then the URL's user info and the secret query
// parameters, in a fixed order (maps iterate at random): sorted as their
// encodings would sort, so that a call with a few credential headers
// costs no allocation.
func (c *config) appendCredentials(b []byte, req *http.Request, creds []credential) []byte {
	if u := req.URL.User; u != nil {
		creds = append(creds, credential{tag: 'u', name: u.String()})
	}
	if req.URL.RawQuery != "" && c.hasSecretQuery(req.URL.RawQuery) {
		for k, vs := range req.URL.Query() {
			if c.isSecretQuery(k) {
				for _, v := range vs {
					creds = append(creds, credential{'q', k, v, true})
				}
			}
		}
	}
	slices.SortFunc(creds, compareCredentials)
	for _, cr := range creds {
		b = appendString(b, cr.tag, cr.name)
		if cr.hasValue {
			b = appendString(b, 'v', cr.value)
		}
	}
	return b
}

// credential is one credential of a call, as appendCredentials encodes
// it: tag and name, then, if hasValue, 'v' and value, each string after
// its length.
type credential struct {
	tag         byte
	name, value string
	hasValue    bool
}

// compareCredentials orders credentials as the bytes of their encodings
// compare: by tag, then by the name's length and the name (the length
// comes first in the encoding), then by the value's length and the value.
// Credentials of one tag all have a value or none.
func compareCredentials(a, b credential) int {
	if a.tag != b.tag {
		return int(a.tag) - int(b.tag)
	}
	if c := cmp.Compare(len(a.name), len(b.name)); c != 0 {
		return c
	}
	if c := strings.Compare(a.name, b.name); c != 0 {
		return c
	}
	if c := cmp.Compare(len(a.value), len(b.value)); c != 0 {
		return c
	}
	return strings.Compare(a.value, b.value)
}

// appendString appends a tag and s, length-prefixed, to b, so that no two
// different sequences share an encoding.
func appendString(b []byte, tag byte, s string) []byte {
	b = append(b, tag)
	b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
	return append(b, s...)
}
