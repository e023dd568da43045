package idemserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemserver"
)

// brokenWriter is a ResponseWriter whose writes fail once the response
// was flushed, as when the client goes away in the middle of a stream.
type brokenWriter struct {
	*httptest.ResponseRecorder
	flushed bool
}

func (b *brokenWriter) Write(p []byte) (int, error) {
	if b.flushed {
		return 0, errors.New("client went away")
	}
	return b.ResponseRecorder.Write(p)
}

func (b *brokenWriter) Flush() { b.flushed = true; b.ResponseRecorder.Flush() }

// problem is a decoded problem document.
type problem struct {
	Type, Title, Detail string
	Status              int
	OriginalStatus      int `json:"original_status"`
}

func decodeProblem(t *testing.T, w *httptest.ResponseRecorder) problem {
	t.Helper()
	assert.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
	var p problem
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p), "body %q", w.Body.String())
	return p
}

// TestNotKept: the handler ran and its client saw (part of) its answer,
// but the answer could not be kept; a retry gets a problem saying so,
// never a second run.
func TestNotKept(t *testing.T) {
	tests := []struct {
		name     string
		first    func(w http.ResponseWriter, r *http.Request)
		wrap     func(w *httptest.ResponseRecorder) http.ResponseWriter
		original int
	}{
		{name: "3 MiB answer", first: func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte(strings.Repeat("z", 3<<20)))
		}, original: http.StatusCreated},
		{name: "panic after flush", first: func(w http.ResponseWriter, _ *http.Request) {
			w.Write([]byte("half"))
			w.(http.Flusher).Flush()
			panic("boom")
		}, original: http.StatusOK},
		{name: "stream failed after flush", first: func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusAccepted)
			w.Write([]byte("event 1\n"))
			w.(http.Flusher).Flush()
			w.Write([]byte("event 2\n"))
		}, wrap: func(w *httptest.ResponseRecorder) http.ResponseWriter { return &brokenWriter{ResponseRecorder: w} },
			original: http.StatusAccepted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			forStores(t, func(t *testing.T, s idemserver.Store) {
				a := firstThen(tt.first)
				h := idemserver.New(s, idemserver.WithSingleTenant()).Required(a)
				func() {
					defer func() { recover() }()
					r := httptest.NewRequest(http.MethodPost, "/v1/orders", strings.NewReader("a"))
					r.Header.Set("Idempotency-Key", "k1")
					rec := httptest.NewRecorder()
					var w http.ResponseWriter = rec
					if tt.wrap != nil {
						w = tt.wrap(rec)
					}
					h.ServeHTTP(w, r)
				}()
				w := do(h, req{key: "k1", body: "a"})
				assert.EqualValues(t, 1, a.runs.Load(), "the handler ran once")
				assert.Equal(t, http.StatusConflict, w.Code)
				p := decodeProblem(t, w)
				assert.Equal(t, idemserver.ProblemNotKept, p.Type)
				assert.Equal(t, tt.original, p.OriginalStatus)
				assert.Contains(t, p.Detail, "not run again")
			})
		})
	}
}

// TestHijackedNotRerun: a handler that hijacked its connection answered
// in a way the middleware cannot see; a retry must not run it again.
func TestHijackedNotRerun(t *testing.T) {
	var runs atomic.Int32
	h := idemserver.New(idemserver.NewMemoryStore(), idemserver.WithSingleTenant()).Required(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) > 1 {
			w.WriteHeader(http.StatusCreated)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 201 Created\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
		brw.Flush()
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	post := func() *http.Response {
		r, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("a"))
		require.NoError(t, err)
		r.Header.Set("Idempotency-Key", "k1")
		resp, err := srv.Client().Do(r)
		require.NoError(t, err)
		return resp
	}
	resp := post()
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	resp.Body.Close()
	for i := 0; ; i++ { // the record is written once the handler returned, after its client read the answer
		resp = post()
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), idemserver.ProblemInProgress) || i == 100 {
			resp.Body = io.NopCloser(strings.NewReader(string(body)))
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	assert.Equal(t, http.StatusConflict, resp.StatusCode)
	body, _ := io.ReadAll(resp.Body)
	assert.Contains(t, string(body), idemserver.ProblemNotKept)
	assert.EqualValues(t, 1, runs.Load())
}

// refusing wraps a store whose Complete fails while refuse is set.
type refusing struct {
	idemserver.Store
	refuse atomic.Bool
}

func (s *refusing) Complete(ctx context.Context, c idemserver.Completion) error {
	if s.refuse.Load() {
		return idem.ErrJournalWrite
	}
	return s.Store.Complete(ctx, c)
}

// TestUnstoredAnswerIs503: an answer the store cannot take is withheld
// (503), and the key stays held until its lease lapses.
func TestUnstoredAnswerIs503(t *testing.T) {
	forStores(t, func(t *testing.T, s idemserver.Store) {
		rs := &refusing{Store: s}
		rs.refuse.Store(true)
		a := &app{}
		h := idemserver.New(rs, idemserver.WithSingleTenant(), idemserver.WithLease(30*time.Second)).Required(a)
		w := do(h, req{key: "k1", body: "a"})
		assert.Equal(t, http.StatusServiceUnavailable, w.Code)
		p := decodeProblem(t, w)
		assert.Equal(t, idemserver.ProblemNotStored, p.Type)
		assert.Empty(t, w.Header().Get("Location"), "none of the handler's headers leak")
		assert.NotEmpty(t, w.Header().Get("Retry-After"))

		rs.refuse.Store(false)
		assert.Equal(t, http.StatusConflict, do(h, req{key: "k1", body: "a"}).Code, "the key is held")
		time.Sleep(30 * time.Second)
		w = do(h, req{key: "k1", body: "a"})
		assert.Equal(t, http.StatusCreated, w.Code, "after the lease the retry runs")
		assert.EqualValues(t, 2, a.runs.Load())
	})
}

// TestStreamNotStoredIsAborted: a streamed answer whose storing fails is
// cut off, so the client cannot take it for a whole answer.
func TestStreamNotStoredIsAborted(t *testing.T) {
	forStores(t, func(t *testing.T, s idemserver.Store) {
		rs := &refusing{Store: s}
		rs.refuse.Store(true)
		h := idemserver.New(rs, idemserver.WithSingleTenant()).Required(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte("part 1"))
			w.(http.Flusher).Flush()
			w.Write([]byte("part 2"))
		}))
		var p any
		func() {
			defer func() { p = recover() }()
			do(h, req{key: "k1", body: "a"})
		}()
		assert.Equal(t, http.ErrAbortHandler, p)
	})
}

// blackHole wraps a store whose Begin (or Complete) waits until its
// context ends, as a database that drops packets.
type blackHole struct {
	idemserver.Store
	begin, complete bool
}

func (s *blackHole) Begin(ctx context.Context, b idemserver.Begin) (idemserver.Claim, error) {
	if s.begin {
		<-ctx.Done()
		return idemserver.Claim{}, context.Cause(ctx)
	}
	return s.Store.Begin(ctx, b)
}

func (s *blackHole) Complete(ctx context.Context, c idemserver.Completion) error {
	if s.complete {
		<-ctx.Done()
		return context.Cause(ctx)
	}
	return s.Store.Complete(ctx, c)
}

// TestStoreCallsBounded: a black-holed store holds a request for the
// store timeout, not for the operating system's TCP timeout.
func TestStoreCallsBounded(t *testing.T) {
	for _, tt := range []struct {
		name  string
		store blackHole
	}{{"claim", blackHole{begin: true}}, {"completion", blackHole{complete: true}}} {
		t.Run(tt.name, func(t *testing.T) {
			forStores(t, func(t *testing.T, s idemserver.Store) {
				st := tt.store
				st.Store = s
				h := idemserver.New(&st, idemserver.WithSingleTenant(), idemserver.WithStoreTimeout(2*time.Second)).Required(&app{})
				start := time.Now()
				w := do(h, req{key: "k1", body: "a"})
				assert.Equal(t, http.StatusServiceUnavailable, w.Code)
				assert.Equal(t, 2*time.Second, time.Since(start), "held for the store timeout (synctest time)")
			})
		})
	}
}
