package idemserver

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
)

// recorder is the http.ResponseWriter a handler that holds a key writes
// to. It buffers the response so that it can be stored before it is sent.
// Once the handler flushes, or the body outgrows the storage limit, it
// sends what it has and writes through from then on; it still keeps a
// copy of a flushed body that fits, so a stream is stored when it ends.
// Like net/http, it takes the header as it stands when the status is
// written.
type recorder struct {
	w        http.ResponseWriter
	max      int
	replay   []string // the headers to keep (see WithReplayHeaders)
	status   int
	sent     http.Header // the replay headers at WriteHeader time
	body     bytes.Buffer
	through  bool // the status and buffered body went to w
	overflow bool // the body outgrew max; body is no longer kept
	failed   bool // a write or flush to w failed after the status went out
	hijacked bool
}

// Header implements http.ResponseWriter. The handler's header is the
// underlying writer's, so that it is in place whenever the response goes
// out.
func (rec *recorder) Header() http.Header { return rec.w.Header() }

// WriteHeader implements http.ResponseWriter. Informational (1xx) answers
// go out at once and are not stored.
func (rec *recorder) WriteHeader(status int) {
	if rec.hijacked {
		return
	}
	if status < 200 {
		rec.w.WriteHeader(status)
		return
	}
	if rec.status == 0 {
		rec.status = status
		rec.sent = pick(rec.w.Header(), rec.replay)
	}
}

// Write implements http.ResponseWriter.
func (rec *recorder) Write(p []byte) (int, error) {
	if rec.hijacked {
		return 0, http.ErrHijacked
	}
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	if !rec.overflow && rec.body.Len()+len(p) > rec.max {
		rec.passThrough()
		rec.overflow = true
		rec.body = bytes.Buffer{}
	}
	if !rec.overflow {
		rec.body.Write(p)
	}
	if !rec.through {
		return len(p), nil
	}
	n, err := rec.w.Write(p)
	if err != nil {
		rec.failed = true
	}
	return n, err
}

// passThrough sends the status and the body buffered so far, if they
// were not sent yet.
func (rec *recorder) passThrough() {
	if rec.through {
		return
	}
	rec.through = true
	rec.WriteHeader(http.StatusOK) // unless the handler wrote its own
	rec.w.WriteHeader(rec.status)
	if rec.body.Len() > 0 {
		if _, err := rec.w.Write(rec.body.Bytes()); err != nil {
			rec.failed = true
		}
	}
}

// FlushError sends what was written so far; the response is still stored
// when the handler returns, if it fits. It implements the interface
// http.ResponseController uses.
func (rec *recorder) FlushError() error {
	if rec.hijacked {
		return http.ErrHijacked
	}
	rec.passThrough()
	err := http.NewResponseController(rec.w).Flush()
	if err != nil {
		rec.failed = true
	}
	return err
}

// Flush implements http.Flusher.
func (rec *recorder) Flush() { _ = rec.FlushError() }

// Hijack implements http.Hijacker. A hijacked response is not kept.
func (rec *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(rec.w).Hijack()
	if err == nil {
		rec.hijacked, rec.through = true, true
	}
	return conn, brw, err
}

// Unwrap returns the underlying writer, for http.ResponseController's
// other features (deadlines, full duplex).
func (rec *recorder) Unwrap() http.ResponseWriter { return rec.w }

var (
	_ http.Flusher  = (*recorder)(nil)
	_ http.Hijacker = (*recorder)(nil)
)
