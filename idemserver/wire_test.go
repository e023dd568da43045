package idemserver_test

import (
	"bufio"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemserver"
)

// wireAnswer is one HTTP/1.1 response as read from the connection, with
// its Date header left out (it differs from second to second).
type wireAnswer struct {
	Informational []string // each 1xx answer but 101: status line and header lines
	Status        string   // the final status line
	Header        []string // the header lines in wire order
	Chunked       bool
	Body          string // the body with its framing removed
	Trailer       []string
	Complete      bool   // the body ended as its framing says
	Rest          string // bytes after the answer (a hijacked or upgraded connection)
}

// without returns a's header lines without those of header name.
func (a wireAnswer) without(name string) []string {
	var out []string
	for _, l := range a.Header {
		if !strings.HasPrefix(strings.ToLower(l), strings.ToLower(name)+":") {
			out = append(out, l)
		}
	}
	return out
}

// fetchWire sends a keyed POST over a new TCP connection to srv and reads
// the raw answer until the server closes the connection.
func fetchWire(t *testing.T, srv *httptest.Server, key string) wireAnswer {
	t.Helper()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second))) // a bound, not an assertion
	body := `{"n":1}`
	_, err = io.WriteString(conn, "POST /orders HTTP/1.1\r\nHost: example.test\r\nIdempotency-Key: "+key+
		"\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\nConnection: close\r\n\r\n"+body)
	require.NoError(t, err)
	raw, err := io.ReadAll(conn)
	if err != nil && !strings.Contains(err.Error(), "reset") {
		require.NoError(t, err)
	}
	return parseWire(t, string(raw))
}

// parseWire parses raw as 1xx answers, then one final answer.
func parseWire(t *testing.T, raw string) wireAnswer {
	t.Helper()
	br := bufio.NewReader(strings.NewReader(raw))
	var a wireAnswer
	readBlock := func() (string, []string) {
		status, err := br.ReadString('\n')
		require.NoError(t, err, "raw answer %q", raw)
		var lines []string
		for {
			l, err := br.ReadString('\n')
			require.NoError(t, err, "raw answer %q", raw)
			if l == "\r\n" {
				break
			}
			if !strings.HasPrefix(l, "Date: ") {
				lines = append(lines, strings.TrimSuffix(l, "\r\n"))
			}
		}
		return strings.TrimSuffix(status, "\r\n"), lines
	}
	for {
		status, lines := readBlock()
		code, _ := strconv.Atoi(strings.Fields(status)[1])
		if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
			a.Informational = append(a.Informational, status+"\n"+strings.Join(lines, "\n"))
			continue
		}
		a.Status, a.Header = status, lines
		break
	}
	get := func(name string) string {
		for _, l := range a.Header {
			if k, v, ok := strings.Cut(l, ": "); ok && strings.EqualFold(k, name) {
				return v
			}
		}
		return ""
	}
	code, _ := strconv.Atoi(strings.Fields(a.Status)[1])
	switch {
	case code == http.StatusSwitchingProtocols || code == http.StatusNoContent || code == http.StatusNotModified:
		a.Complete = true
	case get("Transfer-Encoding") == "chunked":
		a.Chunked = true
		var body strings.Builder
		for {
			l, err := br.ReadString('\n')
			if err != nil {
				break
			}
			n, err := strconv.ParseInt(strings.TrimSuffix(l, "\r\n"), 16, 64)
			require.NoError(t, err, "chunk size in %q", raw)
			if n == 0 {
				for {
					l, err := br.ReadString('\n')
					if err != nil || l == "\r\n" {
						a.Complete = err == nil
						break
					}
					a.Trailer = append(a.Trailer, strings.TrimSuffix(l, "\r\n"))
				}
				break
			}
			chunk := make([]byte, n+2)
			if _, err := io.ReadFull(br, chunk); err != nil {
				break
			}
			body.Write(chunk[:n])
		}
		a.Body = body.String()
	case get("Content-Length") != "":
		n, err := strconv.Atoi(get("Content-Length"))
		require.NoError(t, err)
		b := make([]byte, n)
		m, _ := io.ReadFull(br, b)
		a.Body, a.Complete = string(b[:m]), m == n
	default:
		b, _ := io.ReadAll(br)
		a.Body, a.Complete = string(b), true
	}
	rest, _ := io.ReadAll(br)
	a.Rest = string(rest)
	return a
}

// quietServer starts h on a loopback server whose panics are not logged.
func quietServer(t *testing.T, h http.Handler) *httptest.Server {
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// TestWireReplayIsTheFirstAnswer runs each handler shape three ways, on
// plain net/http, under the middleware, and under the middleware again
// with the same key, and compares the raw bytes of the answers (without
// Date): the middleware's first answer must be what net/http alone sends,
// and the replay must be that answer again, with Idempotent-Replayed, or,
// for an answer that cannot be replayed (a switched or hijacked
// connection, a stream cut off by a panic), a "not kept" problem naming
// the status first sent. A streamed answer's replay may be framed
// differently (one write, not the handler's flushes); its status, header
// lines, body and trailers are still the same.
func TestWireReplayIsTheFirstAnswer(t *testing.T) {
	tests := []struct {
		name     string
		h        http.HandlerFunc
		streamed bool // the replay may frame the body differently
		notKept  int  // the replay is a "not kept" problem with this original status
	}{
		{name: "late headers", h: func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusCreated)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Location", "/orders/1")
			w.Write([]byte(`{"id":1}`))
		}},
		{name: "late headers kept map", h: func(w http.ResponseWriter, _ *http.Request) {
			h := w.Header()
			h.Set("Location", "/orders/1")
			w.WriteHeader(http.StatusCreated)
			h.Set("Location", "/orders/2")
			h.Add("Location", "/orders/3")
			w.Write([]byte(`{"id":1}`))
		}},
		{name: "declared trailers", h: func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			w.Header().Set("Trailer", "X-Checksum, X-Count")
			w.WriteHeader(http.StatusOK)
			w.Write([]byte("counted body"))
			w.Header().Set("X-Checksum", "abc123")
			w.Header().Set("X-Count", "12")
		}},
		{name: "prefixed trailers", h: func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			w.Header().Set(http.TrailerPrefix+"X-Sum", "0")
			w.Write([]byte("body"))
			w.Header().Set(http.TrailerPrefix+"X-Sum", "42")
		}},
		{name: "prefixed trailer after the body", h: func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			w.Write([]byte("body")) // unflushed: net/http frames it with Content-Length and drops the trailer
			w.Header().Set(http.TrailerPrefix+"X-Sum", "42")
		}},
		{name: "1xx then final", h: func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Link", "</style.css>; rel=preload; as=style")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte("<p>made</p>"))
		}},
		{name: "101", h: func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Upgrade", "idem-test")
			w.Header().Set("Connection", "Upgrade")
			w.WriteHeader(http.StatusSwitchingProtocols)
		}, notKept: http.StatusSwitchingProtocols},
		{name: "101 then hijack", h: func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Upgrade", "idem-test")
			w.Header().Set("Connection", "Upgrade")
			w.WriteHeader(http.StatusSwitchingProtocols)
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				panic(err)
			}
			defer conn.Close()
			brw.WriteString("switched protocol bytes")
			brw.Flush()
		}, notKept: http.StatusSwitchingProtocols},
		{name: "hijack", h: func(w http.ResponseWriter, _ *http.Request) {
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				panic(err)
			}
			defer conn.Close()
			brw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
			brw.Flush()
		}, notKept: -1},
		{name: "SSE", h: func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Cache-Control", "no-cache")
			for i := range 3 {
				w.Write([]byte("data: " + strconv.Itoa(i) + "\n\n"))
				w.(http.Flusher).Flush()
			}
		}, streamed: true},
		{name: "empty handler", h: func(http.ResponseWriter, *http.Request) {}},
		{name: "headers only", h: func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Location", "/orders/7")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusAccepted)
		}},
		{name: "headers only, no status", h: func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Location", "/orders/7")
			w.Header().Set("Cache-Control", "no-store")
		}},
		{name: "panic after flush", h: func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			w.Write([]byte("half"))
			w.(http.Flusher).Flush()
			panic("boom")
		}, streamed: true, notKept: http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plain := fetchWire(t, quietServer(t, tt.h), "k1")
			mw := idemserver.New(idemserver.NewMemoryStore(), idemserver.WithSingleTenant(),
				idemserver.WithReplayHeaders("Content-Type", "Location", "Link", "Cache-Control", "Upgrade", "Connection"))
			defer mw.Close()
			srv := quietServer(t, mw.Required(tt.h))
			first := fetchWire(t, srv, "k1")
			assert.Equal(t, plain, first, "the middleware changed what the handler put on the wire")

			again := fetchWire(t, srv, "k1")
			assert.Contains(t, again.Header, idemserver.ReplayedHeader+": true")
			if tt.notKept != 0 {
				assert.Equal(t, "HTTP/1.1 409 Conflict", again.Status)
				var p struct {
					Type           string
					OriginalStatus int `json:"original_status"`
				}
				require.NoError(t, json.Unmarshal([]byte(again.Body), &p), again.Body)
				assert.Equal(t, idemserver.ProblemNotKept, p.Type)
				assert.Equal(t, max(tt.notKept, 0), p.OriginalStatus)
				return
			}
			assert.Empty(t, again.Informational, "1xx answers are not replayed")
			assert.Equal(t, first.Status, again.Status)
			want, got := first.Header, again.without(idemserver.ReplayedHeader)
			if tt.streamed {
				want, got = first.without("Transfer-Encoding"), without(got, "Transfer-Encoding", "Content-Length")
			} else {
				assert.Equal(t, first.Chunked, again.Chunked, "framing")
			}
			assert.Equal(t, want, got, "header lines")
			assert.Equal(t, first.Body, again.Body)
			assert.Equal(t, first.Trailer, again.Trailer)
			assert.True(t, again.Complete)
		})
	}
}

// without returns lines without those of the headers names.
func without(lines []string, names ...string) []string {
	a := wireAnswer{Header: lines}
	for _, n := range names {
		a.Header = a.without(n)
	}
	return a.Header
}

// TestWebhookWithoutEventID: a delivery without an event id is told its
// id is missing; one with a malformed id is told it is invalid.
func TestWebhookWithoutEventID(t *testing.T) {
	mw := idemserver.New(idemserver.NewMemoryStore(), idemserver.WithSingleTenant())
	defer mw.Close()
	tests := []struct {
		name, header, body string
		id                 idemserver.EventID
		typ, detail        string
	}{
		{"no header", "", `{}`, nil, idemserver.ProblemMissingKey, "missing"},
		{"empty JSON id", "", `{"id":""}`, idemserver.JSONEventID("id"), idemserver.ProblemMissingKey, "missing"},
		{"no JSON id", "", `{"type":"x"}`, idemserver.JSONEventID("id"), idemserver.ProblemMissingKey, "missing"},
		{"bad header", "a b", `{}`, nil, idemserver.ProblemInvalidKey, "invalid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runs := 0
			h := mw.Webhook(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { runs++ }), tt.id)
			r := httptest.NewRequest(http.MethodPost, "/hooks", strings.NewReader(tt.body))
			if tt.header != "" {
				r.Header.Set(idemserver.StandardWebhookIDHeader, tt.header)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			assert.Equal(t, http.StatusBadRequest, w.Code)
			p := decodeProblem(t, w)
			assert.Equal(t, tt.typ, p.Type)
			assert.Contains(t, strings.ToLower(p.Title+" "+p.Detail), tt.detail)
			if tt.detail == "missing" {
				assert.NotContains(t, strings.ToLower(p.Title+" "+p.Detail), "invalid")
			}
			assert.Zero(t, runs)
		})
	}
}
