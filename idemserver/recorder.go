package idemserver

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
)

// recorder is the http.ResponseWriter a handler that holds a key writes
// to. It buffers the response so that it can be stored before it is sent;
// once the body outgrows the storage limit, or the handler flushes, it
// sends what it has and writes through from then on. Like net/http, it
// takes the header as it stands when the status is written.
type recorder struct {
	w        http.ResponseWriter
	max      int
	status   int
	sent     http.Header // header at WriteHeader time
	body     bytes.Buffer
	through  bool // the status and buffered body went to w
	overflow bool // the body outgrew max; body is no longer kept
	hijacked bool
}

// Header implements http.ResponseWriter. The handler's header is the
// underlying writer's, so that it is in place whenever the response goes
// out.
func (rec *recorder) Header() http.Header { return rec.w.Header() }

// WriteHeader implements http.ResponseWriter. Informational (1xx) answers
// go out at once and are not stored.
func (rec *recorder) WriteHeader(status int) {
	if status < 200 {
		rec.w.WriteHeader(status)
		return
	}
	if rec.status == 0 {
		rec.status = status
		rec.sent = rec.w.Header().Clone()
	}
}

// Write implements http.ResponseWriter.
func (rec *recorder) Write(p []byte) (int, error) {
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	if !rec.overflow && rec.body.Len()+len(p) > rec.max {
		rec.overflow = true
		rec.passThrough()
		rec.body = bytes.Buffer{}
	}
	if !rec.overflow {
		rec.body.Write(p)
	}
	if rec.through {
		return rec.w.Write(p)
	}
	return len(p), nil
}

// passThrough sends the status and the body buffered so far.
func (rec *recorder) passThrough() {
	if rec.through {
		return
	}
	rec.through = true
	if rec.status == 0 {
		rec.status = http.StatusOK
		rec.sent = rec.w.Header().Clone()
	}
	rec.w.WriteHeader(rec.status)
	if rec.body.Len() > 0 {
		rec.w.Write(rec.body.Bytes())
	}
}

// FlushError sends what was written so far; the response is still stored
// if it fits. It implements the interface http.ResponseController uses.
func (rec *recorder) FlushError() error {
	rec.passThrough()
	return http.NewResponseController(rec.w).Flush()
}

// Flush implements http.Flusher.
func (rec *recorder) Flush() { _ = rec.FlushError() }

// Hijack implements http.Hijacker. A hijacked response is not stored.
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

// finish sends the response if it is still buffered.
func (rec *recorder) finish() {
	if rec.through {
		return
	}
	rec.passThrough()
}

var (
	_ http.Flusher  = (*recorder)(nil)
	_ http.Hijacker = (*recorder)(nil)
)
