package idemserver

import (
	"net/http"
	"sync/atomic"
)

// DefaultMaxBufferedBytes bounds the bytes the middleware holds for keyed
// requests in flight: 256 MiB, room at the default body and response
// limits for 127 requests whose bodies are of unknown length (each
// reserves 2 MiB and a byte), and for about 255 with small bodies of
// known length.
const DefaultMaxBufferedBytes = 256 << 20

// WithMaxBufferedBytes bounds, in bytes, what the middleware buffers for
// keyed requests (and webhook deliveries) in flight: their bodies, which
// it reads whole to fingerprint them, and their answers, which it records
// to store them before sending (or reads from the store to replay them).
// Before it reads a request's body, the middleware reserves the body's
// Content-Length (or the body limit when the length is unknown or larger,
// see WithMaxBodyBytes) plus the response limit (WithMaxResponseBytes),
// and gives them back when the request is answered. A request whose
// reservation does not fit gets 503 (ProblemOverloaded) with Retry-After
// before its body is read, and its key stays as it was: a retry is a
// first request.
//
// So the worst case is n bytes of bodies and answers at once, whatever
// clients send, plus what each request costs outside the middleware
// (net/http's own buffers, the handler's memory). A reservation larger
// than n (limits set above it) is cut to n: such a request runs alone.
// The default is DefaultMaxBufferedBytes.
func WithMaxBufferedBytes(n int64) Option {
	return func(c *config) {
		if n > 0 {
			c.maxBuffered = n
		}
	}
}

// budget is the bytes keyed requests in flight have reserved.
type budget struct {
	used atomic.Int64
}

// take reserves n of max bytes and reports whether they fit.
func (b *budget) take(n, max int64) bool {
	for {
		used := b.used.Load()
		if used+n > max {
			return false
		}
		if b.used.CompareAndSwap(used, used+n) {
			return true
		}
	}
}

// give returns n reserved bytes.
func (b *budget) give(n int64) { b.used.Add(-n) }

// reserve reserves what r's body and answer may take, or answers 503 and
// returns 0, false.
func (m *Middleware) reserve(w http.ResponseWriter, r *http.Request) (int64, bool) {
	body := m.cfg.maxBody + 1 // readBody reads a byte more to find a longer body
	if r.ContentLength >= 0 && r.ContentLength < body {
		body = r.ContentLength
	}
	n := min(body+int64(m.cfg.maxResponse), m.cfg.maxBuffered)
	if m.buffered.take(n, m.cfg.maxBuffered) {
		return n, true
	}
	m.cfg.logger.Warn("idemserver: request refused: the bytes buffered by requests in flight are at their bound (see WithMaxBufferedBytes)",
		"reserved", m.buffered.used.Load(), "max", m.cfg.maxBuffered, "wanted", n)
	writeProblem(w, http.StatusServiceUnavailable, ProblemOverloaded, "Too many requests in flight",
		"The server holds as many request bodies and answers as it allows; retry later.", m.cfg.retryAfter)
	return 0, false
}
