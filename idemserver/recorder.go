package idemserver

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
)

// recorder is the http.ResponseWriter a handler that holds a key writes
// to. It buffers the response so that it can be stored before it is sent.
// Once the handler flushes, hijacks, or the body outgrows the storage
// limit, it sends what it has and writes through from then on; it still
// keeps a copy of a flushed body that fits, so a stream is stored when it
// ends.
//
// It puts on the wire what net/http alone would, and keeps that: the
// header as it stood when the status was written (later changes are
// ignored, as net/http ignores them, though the status reaches the
// connection later), the trailers net/http sends after the body, 101 as
// a final status and other 1xx answers sent at once and not kept.
type recorder struct {
	w        http.ResponseWriter
	max      int
	replay   []string // the headers to keep (see WithReplayHeaders)
	status   int
	wire     http.Header // w's header when the status was written: a shallow copy (values set or added later are new slices)
	body     bytes.Buffer
	through  bool // the status and buffered body went to w
	early    bool // the status went to w before the handler returned
	overflow bool // the body outgrew max; body is no longer kept
	failed   bool // a write or flush to w failed after the status went out
	hijacked bool
}

// Header implements http.ResponseWriter. The handler's header is the
// underlying writer's, so that trailers set after the body are where
// net/http looks for them.
func (rec *recorder) Header() http.Header { return rec.w.Header() }

// WriteHeader implements http.ResponseWriter. Informational answers but
// 101 go out at once, with the header as it stands (RFC 8297), and are not
// stored; 101 Switching Protocols is final, as net/http takes it. A code
// net/http refuses panics, as net/http does.
func (rec *recorder) WriteHeader(status int) {
	if rec.hijacked || rec.status != 0 {
		return
	}
	if status < 100 || status > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", status))
	}
	if status < 200 && status != http.StatusSwitchingProtocols {
		rec.w.WriteHeader(status)
		return
	}
	rec.status = status
	rec.wire = maps.Clone(rec.w.Header())
}

// Write implements http.ResponseWriter.
func (rec *recorder) Write(p []byte) (int, error) {
	if rec.hijacked {
		return 0, http.ErrHijacked
	}
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(rec.status) {
		return 0, http.ErrBodyNotAllowed
	}
	if !rec.overflow && rec.body.Len()+len(p) > rec.max {
		rec.early = true
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
	// The header goes out as it stood at WriteHeader; the handler's later
	// changes come back after, for the trailers net/http reads at the end.
	if h := rec.w.Header(); changed(h, rec.wire) {
		late := maps.Clone(h)
		clear(h)
		maps.Copy(h, rec.wire)
		rec.w.WriteHeader(rec.status)
		clear(h)
		maps.Copy(h, late)
	} else {
		rec.w.WriteHeader(rec.status)
	}
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
	rec.early = true
	rec.passThrough()
	err := http.NewResponseController(rec.w).Flush()
	if err != nil {
		rec.failed = true
	}
	return err
}

// Flush implements http.Flusher.
func (rec *recorder) Flush() { _ = rec.FlushError() }

// Hijack implements http.Hijacker. A status written before goes out
// first, as net/http sends it (a 101 before a protocol switch). A hijacked
// response is not kept.
func (rec *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if rec.hijacked {
		return nil, nil, http.ErrHijacked
	}
	if rec.status != 0 {
		rec.early = true
		rec.passThrough()
	}
	conn, brw, err := http.NewResponseController(rec.w).Hijack()
	if err == nil {
		rec.hijacked, rec.through = true, true
	}
	return conn, brw, err
}

// Unwrap returns the underlying writer, for http.ResponseController's
// other features (deadlines, full duplex).
func (rec *recorder) Unwrap() http.ResponseWriter { return rec.w }

// stored returns the header to store with the answer: the replay headers
// as they were sent, and the trailers net/http sent after the body, under
// their http.TrailerPrefix names (with the Trailer header that declared
// them), so that a replay sends them as trailers again. Trailers go out
// only in a chunked answer: one that declared them when the status was
// written, or that began before the handler returned, or whose body
// outgrew net/http's buffer, without a Content-Length of the handler's.
// Trailers that belong to a session are not kept (see WithReplayHeaders).
func (rec *recorder) stored() http.Header {
	out := pick(rec.wire, rec.replay)
	declared := rec.wire["Trailer"]
	chunked := len(declared) > 0 || rec.early || rec.body.Len() > chunkingThreshold
	for k := range rec.wire {
		chunked = chunked || strings.HasPrefix(k, http.TrailerPrefix)
	}
	if !chunked || rec.wire.Get("Content-Length") != "" || !bodyAllowed(rec.status) {
		return out
	}
	live := rec.w.Header()
	for k, v := range live {
		if name, ok := strings.CutPrefix(k, http.TrailerPrefix); ok && len(v) > 0 && keepTrailer(name) {
			out[k] = slices.Clip(v)
		}
	}
	for _, d := range declared {
		for name := range strings.SplitSeq(d, ",") {
			name = http.CanonicalHeaderKey(strings.TrimSpace(name))
			if v := live[name]; len(v) > 0 && keepTrailer(name) {
				out[http.TrailerPrefix+name] = append(slices.Clip(out[http.TrailerPrefix+name]), v...)
			}
		}
	}
	if len(declared) > 0 {
		out["Trailer"] = append([]string(nil), declared...)
	}
	return out
}

// chunkingThreshold is net/http's bufferBeforeChunkingSize: a body longer
// than that, written while the handler runs, is sent chunked.
const chunkingThreshold = 2048

// keepTrailer reports whether the trailer name may be sent (RFC 9110
// §6.5.1, as net/http's httpguts.ValidTrailerHeader judges) and kept.
func keepTrailer(name string) bool {
	switch http.CanonicalHeaderKey(name) {
	case "Authorization", "Cache-Control", "Connection", "Content-Encoding", "Content-Length", "Content-Range",
		"Content-Type", "Expect", "Host", "Keep-Alive", "Max-Forwards", "Pragma", "Proxy-Authenticate",
		"Proxy-Authorization", "Proxy-Connection", "Range", "Realm", "Te", "Trailer", "Transfer-Encoding",
		"Www-Authenticate":
		return false
	}
	return !principalHeaders[http.CanonicalHeaderKey(name)]
}

// changed reports whether h differs from was, a shallow copy of it: a
// header added, deleted or given new values.
func changed(h, was http.Header) bool {
	if len(h) != len(was) {
		return true
	}
	for k, v := range h {
		w, ok := was[k]
		if !ok || len(v) != len(w) || len(v) > 0 && &v[0] != &w[0] {
			return true
		}
	}
	return false
}

// bodyAllowed reports whether a response with status may have a body,
// as net/http judges.
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

var (
	_ http.Flusher  = (*recorder)(nil)
	_ http.Hijacker = (*recorder)(nil)
)
