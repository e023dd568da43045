package idemserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemserver"
)

// storeKinds are the stores every middleware test runs against.
var storeKinds = []struct {
	name string
	open func(t *testing.T) idemserver.Store
}{
	{"memory", func(*testing.T) idemserver.Store { return idemserver.NewMemoryStore() }},
	{"bolt", openBolt},
}

// forStores runs fn for every store kind, each in a synctest bubble with
// a store opened inside it and closed when the test ends.
func forStores(t *testing.T, fn func(t *testing.T, s idemserver.Store)) {
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := k.open(t)
				t.Cleanup(func() { s.Close() })
				fn(t, s)
			})
		})
	}
}

// app is a handler that counts its runs and answers what answer says.
type app struct {
	runs   atomic.Int32
	answer func(w http.ResponseWriter, r *http.Request, run int)
}

func (a *app) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := int(a.runs.Add(1))
	if a.answer != nil {
		a.answer(w, r, n)
		return
	}
	created(w, r, n)
}

// firstThen is an app whose first run answers with first and every later
// run with created.
func firstThen(first func(w http.ResponseWriter, r *http.Request)) *app {
	return &app{answer: func(w http.ResponseWriter, r *http.Request, run int) {
		if run == 1 {
			first(w, r)
			return
		}
		created(w, r, run)
	}}
}

// created answers 201 with the request body echoed and the run number.
func created(w http.ResponseWriter, r *http.Request, run int) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/v1/orders/42")
	w.Header().Set("X-Request-Local", "not replayed")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(map[string]any{"run": run, "got": string(body)})
}

// req is a request for do.
type req struct {
	method, path, key, body string
	header                  http.Header
}

func do(h http.Handler, q req) *httptest.ResponseRecorder {
	if q.method == "" {
		q.method = http.MethodPost
	}
	if q.path == "" {
		q.path = "/v1/orders"
	}
	r := httptest.NewRequest(q.method, q.path, strings.NewReader(q.body))
	for k, v := range q.header {
		r.Header[k] = v
	}
	if q.key != "" {
		r.Header.Set("Idempotency-Key", q.key)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// problemType returns the RFC 9457 type of a problem answer, failing the
// test if the answer is not one or lacks one of type, title, detail and
// status.
func problemType(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	require.Equal(t, "application/problem+json", w.Header().Get("Content-Type"), "body %s", w.Body)
	var doc struct {
		Type, Title, Detail string
		Status              int
	}
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &doc))
	assert.Equal(t, w.Code, doc.Status, "problem status member")
	assert.NotEmpty(t, doc.Type, "problem type member")
	assert.NotEmpty(t, doc.Title, "problem title member")
	assert.NotEmpty(t, doc.Detail, "problem detail member")
	return doc.Type
}

func TestBadRequests(t *testing.T) {
	long := strings.Repeat("k", 256)
	tests := []struct {
		name     string
		req      req
		opts     []idemserver.Option
		status   int
		problem  string
		optional bool
	}{
		{name: "missing key", req: req{}, status: 400, problem: idemserver.ProblemMissingKey},
		{name: "empty key", req: req{header: http.Header{"Idempotency-Key": {""}}}, status: 400, problem: idemserver.ProblemInvalidKey},
		{name: "empty quoted key", req: req{key: `""`}, status: 400, problem: idemserver.ProblemInvalidKey},
		{name: "key over 255 bytes", req: req{key: long}, status: 400, problem: idemserver.ProblemInvalidKey},
		{name: "non-ASCII key", req: req{key: "clé"}, status: 400, problem: idemserver.ProblemInvalidKey},
		{name: "control byte in key", req: req{key: "a\x01b"}, status: 400, problem: idemserver.ProblemInvalidKey},
		{name: "two key headers", req: req{header: http.Header{"Idempotency-Key": {"a", "b"}}}, status: 400, problem: idemserver.ProblemInvalidKey},
		{name: "unterminated quote", req: req{key: `"abc`}, status: 400, problem: idemserver.ProblemInvalidKey},
		{name: "comma in a bare key", req: req{key: "a,b"}, status: 400, problem: idemserver.ProblemInvalidKey},
		{name: "a list of quoted keys", req: req{key: `"a", "b"`}, status: 400, problem: idemserver.ProblemInvalidKey},
		{name: "body over limit", req: req{key: "k1", body: strings.Repeat("x", 101)},
			opts: []idemserver.Option{idemserver.WithMaxBodyBytes(100)}, status: 413, problem: idemserver.ProblemBodyTooLarge},
		{name: "principal refused", req: req{key: "k1"},
			opts: []idemserver.Option{idemserver.WithPrincipal(func(*http.Request) (string, error) {
				return "", errors.New("no api key")
			})}, status: 401, problem: idemserver.ProblemUnauthorized},
		{name: "invalid key on an optional route", req: req{key: long}, status: 400, problem: idemserver.ProblemInvalidKey, optional: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			forStores(t, func(t *testing.T, s idemserver.Store) {
				a := &app{}
				mw := idemserver.New(s, append([]idemserver.Option{idemserver.WithSingleTenant()}, tt.opts...)...)
				h := mw.Required(a)
				if tt.optional {
					h = mw.Optional(a)
				}
				w := do(h, tt.req)
				assert.Equal(t, tt.status, w.Code)
				assert.Equal(t, tt.problem, problemType(t, w))
				assert.Zero(t, a.runs.Load(), "handler ran")
				// Nothing was stored: a valid request with the key runs.
				w = do(idemserver.New(s, idemserver.WithSingleTenant()).Required(a), req{key: "k1", body: "small"})
				assert.Equal(t, http.StatusCreated, w.Code)
				assert.Empty(t, w.Header().Get(idemserver.ReplayedHeader))
			})
		})
	}
}

func TestReplay(t *testing.T) {
	forStores(t, func(t *testing.T, s idemserver.Store) {
		a := &app{}
		h := idemserver.New(s, idemserver.WithSingleTenant()).Required(a)
		first := do(h, req{key: "order-1", body: `{"amount":42}`})
		require.Equal(t, http.StatusCreated, first.Code)
		assert.Empty(t, first.Header().Get(idemserver.ReplayedHeader))

		// Bare and quoted forms are the same key.
		for _, key := range []string{"order-1", `"order-1"`, ` "order-1"`} {
			again := do(h, req{key: key, body: `{"amount":42}`})
			assert.Equal(t, first.Code, again.Code, key)
			assert.Equal(t, first.Body.String(), again.Body.String(), key)
			assert.Equal(t, "true", again.Header().Get(idemserver.ReplayedHeader), key)
			assert.Equal(t, "/v1/orders/42", again.Header().Get("Location"), key)
			assert.Equal(t, "application/json", again.Header().Get("Content-Type"), key)
			assert.Empty(t, again.Header().Get("X-Request-Local"), "headers outside the replay list are not replayed")
		}
		assert.EqualValues(t, 1, a.runs.Load(), "handler runs")
	})
}

func TestOptionalRouteWithoutKeyPassesThrough(t *testing.T) {
	forStores(t, func(t *testing.T, s idemserver.Store) {
		a := &app{}
		h := idemserver.New(s, idemserver.WithSingleTenant()).Optional(a)
		for range 3 {
			w := do(h, req{body: "x"})
			assert.Equal(t, http.StatusCreated, w.Code)
			assert.Empty(t, w.Header().Get(idemserver.ReplayedHeader))
		}
		assert.EqualValues(t, 3, a.runs.Load())
		do(h, req{key: "k", body: "x"})
		assert.Equal(t, "true", do(h, req{key: "k", body: "x"}).Header().Get(idemserver.ReplayedHeader))
		assert.EqualValues(t, 4, a.runs.Load())
	})
}

func TestInFlightConflict(t *testing.T) {
	forStores(t, func(t *testing.T, s idemserver.Store) {
		release := make(chan struct{})
		a := &app{answer: func(w http.ResponseWriter, r *http.Request, run int) {
			<-release
			created(w, r, run)
		}}
		h := idemserver.New(s, idemserver.WithSingleTenant(), idemserver.WithRetryAfter(2*time.Second)).Required(a)
		var first *httptest.ResponseRecorder
		done := make(chan struct{})
		go func() {
			defer close(done)
			first = do(h, req{key: "k1", body: "a"})
		}()
		synctest.Wait() // the first request holds the key in the handler

		w := do(h, req{key: "k1", body: "a"})
		assert.Equal(t, http.StatusConflict, w.Code)
		assert.Equal(t, idemserver.ProblemInProgress, problemType(t, w))
		assert.Equal(t, "2", w.Header().Get("Retry-After"))
		// Another payload is a mismatch even while the first runs.
		assert.Equal(t, http.StatusUnprocessableEntity, do(h, req{key: "k1", body: "b"}).Code)

		close(release)
		<-done
		assert.Equal(t, http.StatusCreated, first.Code)
		w = do(h, req{key: "k1", body: "a"})
		assert.Equal(t, http.StatusCreated, w.Code)
		assert.Equal(t, "true", w.Header().Get(idemserver.ReplayedHeader))
		assert.EqualValues(t, 1, a.runs.Load())
	})
}

func TestMismatch(t *testing.T) {
	tests := []struct {
		name   string
		first  req
		second req
	}{
		{"other body", req{key: "k", body: `{"amount":1}`}, req{key: "k", body: `{"amount":2}`}},
		{"other query", req{key: "k", path: "/v1/orders?currency=eur"}, req{key: "k", path: "/v1/orders?currency=usd"}},
		{"other fingerprint header",
			req{key: "k", header: http.Header{"Content-Type": {"application/json"}}},
			req{key: "k", header: http.Header{"Content-Type": {"text/plain"}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			forStores(t, func(t *testing.T, s idemserver.Store) {
				a := &app{}
				h := idemserver.New(s, idemserver.WithSingleTenant(), idemserver.WithFingerprintHeaders("content-type")).Required(a)
				require.Equal(t, http.StatusCreated, do(h, tt.first).Code)
				w := do(h, tt.second)
				assert.Equal(t, http.StatusUnprocessableEntity, w.Code)
				assert.Equal(t, idemserver.ProblemKeyMismatch, problemType(t, w))
				assert.EqualValues(t, 1, a.runs.Load())
			})
		})
	}
}

func TestNotStored(t *testing.T) {
	tests := []struct {
		name   string
		opts   []idemserver.Option
		first  func(w http.ResponseWriter, r *http.Request)
		stored bool
		// clientBytes is the body length the first client must get, if set.
		clientBytes int
	}{
		{name: "500", first: status(500)},
		{name: "503", first: status(503)},
		{name: "429", first: status(429)},
		{name: "408", first: status(408)},
		{name: "panic", first: func(http.ResponseWriter, *http.Request) { panic("boom") }},
		{name: "panic after writing", first: func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(201)
			w.Write([]byte("half"))
			panic(http.ErrAbortHandler)
		}},
		{name: "404 when client errors are not stored", opts: []idemserver.Option{idemserver.WithStoreClientErrors(false)}, first: status(404)},
		{name: "404 stored by default", first: status(404), stored: true},
		{name: "400 stored by default", first: status(400), stored: true},
		{name: "handler that writes nothing", first: func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Location", "/v1/orders/7")
		}, stored: true},
		{name: "response at the limit", opts: []idemserver.Option{idemserver.WithMaxResponseBytes(64)},
			first: func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte(strings.Repeat("z", 64))) }, stored: true, clientBytes: 64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			forStores(t, func(t *testing.T, s idemserver.Store) {
				a := firstThen(tt.first)
				h := idemserver.New(s, append([]idemserver.Option{idemserver.WithSingleTenant()}, tt.opts...)...).Required(a)
				first := func() (w *httptest.ResponseRecorder, panicked any) {
					defer func() { panicked = recover() }()
					return do(h, req{key: "k1", body: "a"}), nil
				}
				w1, _ := first()
				if tt.clientBytes > 0 {
					assert.Equal(t, tt.clientBytes, w1.Body.Len(), "the whole response reached the client")
				}
				w2 := do(h, req{key: "k1", body: "a"})
				if tt.stored {
					assert.EqualValues(t, 1, a.runs.Load(), "handler runs")
					assert.Equal(t, "true", w2.Header().Get(idemserver.ReplayedHeader))
					assert.Equal(t, w1.Code, w2.Code)
					assert.Equal(t, w1.Body.String(), w2.Body.String())
					assert.Equal(t, w1.Header().Get("Location"), w2.Header().Get("Location"))
					return
				}
				assert.EqualValues(t, 2, a.runs.Load(), "the key was released, so the retry ran the handler")
				assert.Equal(t, http.StatusCreated, w2.Code)
				assert.Empty(t, w2.Header().Get(idemserver.ReplayedHeader))
			})
		})
	}
}

func status(code int) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) { http.Error(w, http.StatusText(code), code) }
}

func TestRetention(t *testing.T) {
	forStores(t, func(t *testing.T, s idemserver.Store) {
		a := &app{}
		mw := idemserver.New(s, idemserver.WithSingleTenant(), idemserver.WithRetention(time.Hour), idemserver.WithSweepInterval(-1))
		h := mw.Required(a)
		do(h, req{key: "k1", body: "a"})
		time.Sleep(time.Hour - time.Second)
		assert.Equal(t, "true", do(h, req{key: "k1", body: "a"}).Header().Get(idemserver.ReplayedHeader))
		n, err := mw.Sweep(context.Background())
		require.NoError(t, err)
		assert.Zero(t, n, "swept before expiry")

		time.Sleep(time.Second)
		n, err = mw.Sweep(context.Background())
		require.NoError(t, err)
		assert.Equal(t, 1, n, "swept at expiry")
		// Expired: the key is new again, with any payload.
		w := do(h, req{key: "k1", body: "b"})
		assert.Equal(t, http.StatusCreated, w.Code)
		assert.Empty(t, w.Header().Get(idemserver.ReplayedHeader))
		assert.EqualValues(t, 2, a.runs.Load())
	})
}

func TestAutomaticSweep(t *testing.T) {
	forStores(t, func(t *testing.T, s idemserver.Store) {
		mw := idemserver.New(s, idemserver.WithSingleTenant(), idemserver.WithRetention(time.Hour), idemserver.WithSweepInterval(10*time.Minute))
		h := mw.Required(&app{})
		do(h, req{key: "old", body: "a"})
		time.Sleep(2 * time.Hour)
		do(h, req{key: "new", body: "a"}) // past the interval: sweeps "old", in the background
		synctest.Wait()
		require.NoError(t, mw.Close())
		n, err := s.Sweep(context.Background(), time.Now())
		require.NoError(t, err)
		assert.Zero(t, n, "the middleware already swept the expired key")
		n, err = s.Sweep(context.Background(), time.Now().Add(time.Hour))
		require.NoError(t, err)
		assert.Equal(t, 1, n, "the fresh key was kept")
	})
}

func TestScopeIsolation(t *testing.T) {
	tests := []struct {
		name string
		a, b req
	}{
		{"other principal", req{key: "k", header: http.Header{"X-User": {"alice"}}}, req{key: "k", header: http.Header{"X-User": {"bob"}}}},
		{"other path", req{key: "k", path: "/v1/orders"}, req{key: "k", path: "/v1/refunds"}},
		{"other method", req{key: "k", method: "POST"}, req{key: "k", method: "PATCH"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			forStores(t, func(t *testing.T, s idemserver.Store) {
				a := &app{}
				h := idemserver.New(s, idemserver.WithSingleTenant(), idemserver.WithPrincipal(func(r *http.Request) (string, error) {
					return r.Header.Get("X-User"), nil
				})).Required(a)
				tt.a.body, tt.b.body = "same", "same"
				wa := do(h, tt.a)
				wb := do(h, tt.b)
				assert.Equal(t, http.StatusCreated, wb.Code)
				assert.Empty(t, wb.Header().Get(idemserver.ReplayedHeader), "b got a's answer")
				assert.NotEqual(t, wa.Body.String(), wb.Body.String())
				assert.EqualValues(t, 2, a.runs.Load())
				// Each replays its own.
				assert.Equal(t, wa.Body.String(), do(h, tt.a).Body.String())
				assert.Equal(t, wb.Body.String(), do(h, tt.b).Body.String())
			})
		})
	}
}

// failing is a store whose every call fails, as a full disk does.
type failing struct{ idemserver.Store }

var errDisk = errors.New("disk full")

func (failing) Begin(context.Context, idemserver.Begin) (idemserver.Claim, error) {
	return idemserver.Claim{}, errDisk
}

func TestStoreUnavailableFailsClosed(t *testing.T) {
	forStores(t, func(t *testing.T, s idemserver.Store) {
		a := &app{}
		w := do(idemserver.New(failing{s}, idemserver.WithSingleTenant()).Required(a), req{key: "k1"})
		assert.Equal(t, http.StatusServiceUnavailable, w.Code)
		assert.Equal(t, idemserver.ProblemUnavailable, problemType(t, w))
		assert.Equal(t, "1", w.Header().Get("Retry-After"))
		assert.Zero(t, a.runs.Load())
	})
	// A closed store too.
	synctest.Test(t, func(t *testing.T) {
		s := openBolt(t)
		require.NoError(t, s.Close())
		a := &app{}
		assert.Equal(t, http.StatusServiceUnavailable, do(idemserver.New(s, idemserver.WithSingleTenant()).Required(a), req{key: "k1"}).Code)
		assert.Zero(t, a.runs.Load())
	})
}

func TestFlushedResponseIsStored(t *testing.T) {
	forStores(t, func(t *testing.T, s idemserver.Store) {
		a := &app{answer: func(w http.ResponseWriter, r *http.Request, run int) {
			w.Header().Set("Content-Type", "text/plain")
			w.Write([]byte("part one;"))
			require.NoError(t, http.NewResponseController(w).Flush())
			w.Write([]byte("part two"))
		}}
		h := idemserver.New(s, idemserver.WithSingleTenant()).Required(a)
		w1 := do(h, req{key: "k1"})
		assert.True(t, w1.Flushed)
		w2 := do(h, req{key: "k1"})
		assert.Equal(t, "part one;part two", w1.Body.String())
		assert.Equal(t, w1.Body.String(), w2.Body.String())
		assert.Equal(t, "true", w2.Header().Get(idemserver.ReplayedHeader))
		assert.EqualValues(t, 1, a.runs.Load())
	})
}

func TestConcurrentSameKeyRunsOnce(t *testing.T) {
	forStores(t, func(t *testing.T, s idemserver.Store) {
		a := &app{}
		h := idemserver.New(s, idemserver.WithSingleTenant()).Required(a)
		var wg sync.WaitGroup
		codes := make([]int, 16)
		for i := range codes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				codes[i] = do(h, req{key: "k1", body: "a"}).Code
			}()
		}
		wg.Wait()
		assert.EqualValues(t, 1, a.runs.Load())
		for _, c := range codes {
			assert.Contains(t, []int{http.StatusCreated, http.StatusConflict}, c)
		}
	})
}
