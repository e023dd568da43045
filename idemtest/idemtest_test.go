package idemtest_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemgo/idem/idemtest"
)

// TestMain fails the package's tests if any goroutine outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// charger is a handler that "charges a card": every run creates a new
// charge ID, so a replay is told apart from a second run by its ID.
type charger struct{ n atomic.Int64 }

func (c *charger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	id := fmt.Sprintf("ch_%d", c.n.Add(1))
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Charge-Id", id)
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%q,"request":%q}`, id, body)
}

// result is what a client saw for one request.
type result struct {
	status int
	header http.Header
	body   string
	err    error
}

func (r result) replayed() bool { return r.header.Get("Idempotent-Replayed") == "true" }

// newClient returns a plain client that never reuses a connection, so that
// net/http does not silently resend keyed requests on a dropped reused
// connection and every dropped connection shows as an error.
func newClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// send sends one request with the key header set by hand (none if key is
// empty) and reads the whole answer.
func send(t *testing.T, c *http.Client, method, url, key, body string) result {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if !assert.NoError(t, err, "new request") {
		return result{err: err}
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, header: resp.Header, body: string(b), err: err}
}

// problemDoc is an RFC 9457 problem details document.
type problemDoc struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// requireProblem checks that res is a problem document with the status and
// type given.
func requireProblem(t *testing.T, res result, status int, typ string) {
	t.Helper()
	require.NoError(t, res.err)
	require.Equal(t, status, res.status, "body: %s", res.body)
	assert.Equal(t, "application/problem+json", res.header.Get("Content-Type"))
	var p problemDoc
	require.NoError(t, json.Unmarshal([]byte(res.body), &p))
	assert.Equal(t, typ, p.Type)
	assert.Equal(t, status, p.Status)
	assert.NotEmpty(t, p.Title, "problem title")
	assert.NotEmpty(t, p.Detail, "problem detail")
}

func TestReplay(t *testing.T) {
	srv := idemtest.NewServer(&charger{})
	defer srv.Close()
	c := newClient(t)

	first := send(t, c, "POST", srv.URL+"/charges", "k1", `{"amount":100}`)
	require.NoError(t, first.err)
	require.Equal(t, http.StatusCreated, first.status)
	assert.False(t, first.replayed(), "first answer replayed")

	for i := range 2 {
		again := send(t, c, "POST", srv.URL+"/charges", "k1", `{"amount":100}`)
		require.NoError(t, again.err)
		assert.Equal(t, first.status, again.status, "replay %d", i)
		assert.Equal(t, first.body, again.body, "replay %d", i)
		assert.Equal(t, first.header.Get("X-Charge-Id"), again.header.Get("X-Charge-Id"), "replay %d", i)
		assert.Equal(t, "application/json", again.header.Get("Content-Type"), "replay %d", i)
		assert.True(t, again.replayed(), "replay %d replayed", i)
	}

	st := srv.Stats()
	assert.Equal(t, 1, st.Runs)
	assert.Equal(t, map[string]int{"k1": 1}, st.RunsByKey)
	assert.Equal(t, map[string]int{"k1": 3}, st.AttemptsByKey)
	assert.Equal(t, map[string]int{idemtest.Fingerprint("POST", "/charges", []byte(`{"amount":100}`)): 1}, st.RunsByPayload)
	assert.Equal(t, 3, st.Requests)
	assert.Equal(t, 2, st.Replays)
	assert.Zero(t, st.DuplicateKeys())
	assert.Zero(t, st.DuplicatePayloads())
}

func TestKeyScope(t *testing.T) {
	// Each case sends a first request POST /a with key k, then the second
	// request below.
	tests := []struct {
		name              string
		method, path, key string
		header            string // key header name on the server
		wantReplay        bool
	}{
		{name: "same method, path and key", method: "POST", path: "/a", key: "k", wantReplay: true},
		{name: "quoted key is the same key", method: "POST", path: "/a", key: `"k"`, wantReplay: true},
		{name: "other path", method: "POST", path: "/b", key: "k"},
		{name: "other method", method: "PATCH", path: "/a", key: "k"},
		{name: "other key", method: "POST", path: "/a", key: "k2"},
		{name: "custom header name", method: "POST", path: "/a", key: "k", header: "Cko-Idempotency-Key", wantReplay: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var opts []idemtest.Option
			header := "Idempotency-Key"
			if tt.header != "" {
				opts = append(opts, idemtest.WithKeyHeader(tt.header))
				header = tt.header
			}
			srv := idemtest.NewServer(&charger{}, opts...)
			defer srv.Close()
			c := newClient(t)
			do := func(method, path, key string) result {
				req, err := http.NewRequest(method, srv.URL+path, strings.NewReader("{}"))
				require.NoError(t, err)
				req.Header.Set(header, key)
				resp, err := c.Do(req)
				require.NoError(t, err)
				defer resp.Body.Close()
				io.Copy(io.Discard, resp.Body)
				return result{status: resp.StatusCode, header: resp.Header}
			}

			first := do("POST", "/a", "k")
			second := do(tt.method, tt.path, tt.key)
			require.Equal(t, http.StatusCreated, first.status)
			require.Equal(t, http.StatusCreated, second.status)
			assert.Equal(t, tt.wantReplay, second.replayed())
			wantRuns := 2
			if tt.wantReplay {
				wantRuns = 1
			}
			assert.Equal(t, wantRuns, srv.Stats().Runs)
		})
	}
}

func TestPayloadMismatch(t *testing.T) {
	srv := idemtest.NewServer(&charger{})
	defer srv.Close()
	c := newClient(t)

	require.Equal(t, http.StatusCreated, send(t, c, "POST", srv.URL+"/charges", "k1", `{"amount":100}`).status)
	requireProblem(t, send(t, c, "POST", srv.URL+"/charges", "k1", `{"amount":999}`),
		http.StatusUnprocessableEntity, idemtest.ProblemKeyMismatch)
	requireProblem(t, send(t, c, "POST", srv.URL+"/charges?currency=eur", "k1", `{"amount":100}`),
		http.StatusUnprocessableEntity, idemtest.ProblemKeyMismatch)
	// The original payload is still replayed.
	assert.True(t, send(t, c, "POST", srv.URL+"/charges", "k1", `{"amount":100}`).replayed(), "replayed")

	st := srv.Stats()
	assert.Equal(t, 1, st.Runs)
	assert.Equal(t, 2, st.Mismatches)
	assert.Equal(t, 1, st.Replays)
}

func TestConcurrentSameKey(t *testing.T) {
	tests := []struct {
		name           string
		opts           []idemtest.Option
		wantRetryAfter string
	}{
		{name: "default Retry-After", wantRetryAfter: "1"},
		{name: "Retry-After 0", opts: []idemtest.Option{idemtest.WithRetryAfter(0)}, wantRetryAfter: "0"},
		{name: "Retry-After rounded up", opts: []idemtest.Option{idemtest.WithRetryAfter(1500 * time.Millisecond)}, wantRetryAfter: "2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			entered := make(chan struct{})
			release := make(chan struct{})
			var ch charger
			var runs atomic.Int64
			// The first run blocks until released; a later run (a bug)
			// answers at once, so the test fails instead of hanging.
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					close(entered)
					<-release
				}
				ch.ServeHTTP(w, r)
			})
			srv := idemtest.NewServer(h, tt.opts...)
			defer srv.Close()
			var once sync.Once
			unblock := func() { once.Do(func() { close(release) }) }
			defer unblock() // before Close, should the test stop early
			c := newClient(t)

			firstc := make(chan result, 1)
			go func() { firstc <- send(t, c, "POST", srv.URL+"/charges", "k1", "a") }()
			<-entered

			busy := send(t, c, "POST", srv.URL+"/charges", "k1", "a")
			requireProblem(t, busy, http.StatusConflict, idemtest.ProblemInProgress)
			assert.Equal(t, tt.wantRetryAfter, busy.header.Get("Retry-After"))
			// A different payload is a mismatch even while the first runs.
			requireProblem(t, send(t, c, "POST", srv.URL+"/charges", "k1", "b"),
				http.StatusUnprocessableEntity, idemtest.ProblemKeyMismatch)

			unblock()
			first := <-firstc
			require.NoError(t, first.err)
			assert.Equal(t, http.StatusCreated, first.status)

			after := send(t, c, "POST", srv.URL+"/charges", "k1", "a")
			assert.True(t, after.replayed(), "replayed")
			assert.Equal(t, first.body, after.body)

			st := srv.Stats()
			assert.Equal(t, 1, st.Runs)
			assert.Equal(t, 1, st.Conflicts)
			assert.Zero(t, st.Faults[idemtest.InProgress], "a real conflict counted as a fault")
		})
	}
}

func TestServerErrorsNotStored(t *testing.T) {
	tests := []struct {
		status int
		stored bool
	}{
		{http.StatusInternalServerError, false},
		{http.StatusBadGateway, false},
		{http.StatusServiceUnavailable, false},
		{http.StatusBadRequest, true},
		{http.StatusNotFound, true},
		{http.StatusOK, true},
	}
	for _, tt := range tests {
		t.Run(http.StatusText(tt.status), func(t *testing.T) {
			var runs atomic.Int64
			// The first run answers tt.status, later runs 201.
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					w.WriteHeader(tt.status)
					fmt.Fprint(w, "first")
					return
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprint(w, "second")
			})
			srv := idemtest.NewServer(h)
			defer srv.Close()
			c := newClient(t)

			first := send(t, c, "POST", srv.URL+"/charges", "k1", "a")
			require.Equal(t, tt.status, first.status)
			retry := send(t, c, "POST", srv.URL+"/charges", "k1", "a")
			require.NoError(t, retry.err)
			if tt.stored {
				assert.Equal(t, tt.status, retry.status)
				assert.Equal(t, "first", retry.body)
				assert.True(t, retry.replayed(), "replayed")
				assert.Equal(t, 1, srv.Stats().RunsByKey["k1"])
			} else {
				assert.Equal(t, http.StatusCreated, retry.status)
				assert.Equal(t, "second", retry.body)
				assert.False(t, retry.replayed(), "replayed")
				assert.Equal(t, 2, srv.Stats().RunsByKey["k1"])
				assert.Equal(t, 1, srv.Stats().DuplicateKeys())
			}
		})
	}
}

func TestHandlerPanicFreesKey(t *testing.T) {
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			panic(http.ErrAbortHandler) // net/http recovers it silently
		}
		w.WriteHeader(http.StatusCreated)
	})
	srv := idemtest.NewServer(h)
	defer srv.Close()
	c := newClient(t)

	assert.Error(t, send(t, c, "POST", srv.URL+"/charges", "k1", "a").err)
	retry := send(t, c, "POST", srv.URL+"/charges", "k1", "a")
	require.NoError(t, retry.err)
	assert.Equal(t, http.StatusCreated, retry.status, "key still held after the handler panicked")
}

func TestRequireKey(t *testing.T) {
	tests := []struct {
		method     string
		requireKey bool
		want       int
	}{
		{"POST", true, http.StatusBadRequest},
		{"PATCH", true, http.StatusBadRequest},
		{"GET", true, http.StatusCreated},
		{"PUT", true, http.StatusCreated},
		{"POST", false, http.StatusCreated},
		{"PATCH", false, http.StatusCreated},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s require=%v", tt.method, tt.requireKey), func(t *testing.T) {
			var opts []idemtest.Option
			if tt.requireKey {
				opts = append(opts, idemtest.WithRequireKey())
			}
			srv := idemtest.NewServer(&charger{}, opts...)
			defer srv.Close()
			c := newClient(t)

			// Without a key every request runs again.
			for range 2 {
				res := send(t, c, tt.method, srv.URL+"/charges", "", "a")
				if tt.want == http.StatusBadRequest {
					requireProblem(t, res, tt.want, idemtest.ProblemMissingKey)
				} else {
					require.NoError(t, res.err)
					assert.Equal(t, tt.want, res.status)
					assert.False(t, res.replayed(), "replayed")
				}
			}
			st := srv.Stats()
			if tt.want == http.StatusBadRequest {
				assert.Equal(t, 2, st.MissingKeys)
				assert.Zero(t, st.Runs)
			} else {
				assert.Equal(t, 2, st.Runs)
				assert.Equal(t, map[string]int{"": 2}, st.RunsByKey)
				assert.Zero(t, st.DuplicateKeys(), "requests without a key counted as a duplicate key")
				assert.Equal(t, 1, st.DuplicatePayloads())
			}
			assert.Equal(t, map[string]int{"": 2}, st.AttemptsByKey)
		})
	}
}

// clock is a fake clock a test moves by hand.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestRetention(t *testing.T) {
	const retention = time.Hour
	tests := []struct {
		name       string
		retention  time.Duration
		advance    time.Duration
		wantReplay bool
	}{
		{name: "within retention", retention: retention, advance: retention - time.Nanosecond, wantReplay: true},
		{name: "retention reached", retention: retention, advance: retention},
		{name: "long after", retention: retention, advance: 48 * time.Hour},
		{name: "zero retention keeps nothing", retention: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := &clock{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
			srv := idemtest.NewServer(&charger{}, idemtest.WithClock(clk.Now), idemtest.WithRetention(tt.retention))
			defer srv.Close()
			c := newClient(t)

			first := send(t, c, "POST", srv.URL+"/charges", "k1", "a")
			require.Equal(t, http.StatusCreated, first.status)
			clk.Advance(tt.advance)
			again := send(t, c, "POST", srv.URL+"/charges", "k1", "a")
			require.Equal(t, http.StatusCreated, again.status)
			assert.Equal(t, tt.wantReplay, again.replayed())
			wantRuns := 2
			if tt.wantReplay {
				wantRuns = 1
			}
			assert.Equal(t, wantRuns, srv.Stats().RunsByKey["k1"])
		})
	}
}

func TestRetentionSweep(t *testing.T) {
	// Expired results are swept, so the server holds no more keys than the
	// retention window keeps plus one sweep interval; live ones stay.
	clk := &clock{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	srv := idemtest.NewServer(&charger{}, idemtest.WithClock(clk.Now), idemtest.WithRetention(time.Minute))
	defer srv.Close()
	c := srv.Client()
	for i := range 200 {
		if i%50 == 0 {
			clk.Advance(time.Hour)
		}
		require.Equal(t, http.StatusCreated, send(t, c, "POST", srv.URL+"/charges", fmt.Sprint("k", i), "a").status)
	}
	// The last hour stored 50 keys; up to max(keys held, 64) more may wait
	// for the next sweep.
	st := srv.Stats()
	assert.GreaterOrEqual(t, st.Keys, 50, "keys held after 200 stores")
	assert.LessOrEqual(t, st.Keys, 50+64+1, "keys held after 200 stores")
	assert.True(t, send(t, c, "POST", srv.URL+"/charges", "k199", "a").replayed(), "replayed")
	assert.False(t, send(t, c, "POST", srv.URL+"/charges", "k0", "a").replayed(), "replayed")
}

// script returns a WithScript function that injects faults[key][attempt-1]
// and no fault beyond the list.
func script(faults map[string][]idemtest.Fault) func(string, int) idemtest.Fault {
	return func(key string, attempt int) idemtest.Fault {
		if f := faults[key]; attempt <= len(f) {
			return f[attempt-1]
		}
		return idemtest.NoFault
	}
}

func TestScriptedFaults(t *testing.T) {
	tests := []struct {
		fault          idemtest.Fault
		wantErr        bool   // the first attempt ends in a network error
		wantStatus     int    // else its status
		wantProblem    string // and problem type
		wantRetryAfter string
		wantRuns       int // handler runs after the first attempt
		wantReplay     bool
	}{
		{fault: idemtest.DropBefore, wantErr: true, wantRuns: 0},
		{fault: idemtest.DropAfter, wantErr: true, wantRuns: 1, wantReplay: true},
		{fault: idemtest.Delay, wantStatus: http.StatusCreated, wantRuns: 1, wantReplay: true},
		{fault: idemtest.Unavailable, wantStatus: http.StatusServiceUnavailable, wantProblem: idemtest.ProblemUnavailable},
		{fault: idemtest.TooManyRequests, wantStatus: http.StatusTooManyRequests, wantProblem: idemtest.ProblemTooManyRequests, wantRetryAfter: "3"},
		{fault: idemtest.InProgress, wantStatus: http.StatusConflict, wantProblem: idemtest.ProblemInProgress, wantRetryAfter: "3"},
	}
	for _, tt := range tests {
		t.Run(tt.fault.String(), func(t *testing.T) {
			srv := idemtest.NewServer(&charger{},
				idemtest.WithScript(script(map[string][]idemtest.Fault{"k1": {tt.fault}})),
				idemtest.WithRetryAfter(3*time.Second),
				idemtest.WithFaultDelay(time.Millisecond))
			defer srv.Close()
			c := newClient(t)

			first := send(t, c, "POST", srv.URL+"/charges", "k1", "a")
			if tt.wantErr {
				require.Error(t, first.err, "status %d", first.status)
			} else {
				require.NoError(t, first.err)
				assert.Equal(t, tt.wantStatus, first.status)
				if tt.wantProblem != "" {
					requireProblem(t, first, tt.wantStatus, tt.wantProblem)
				}
				assert.Equal(t, tt.wantRetryAfter, first.header.Get("Retry-After"))
			}
			assert.Equal(t, tt.wantRuns, srv.Stats().Runs, "runs after the faulty attempt")

			retry := send(t, c, "POST", srv.URL+"/charges", "k1", "a")
			require.NoError(t, retry.err)
			assert.Equal(t, http.StatusCreated, retry.status)
			assert.Equal(t, tt.wantReplay, retry.replayed())

			st := srv.Stats()
			assert.Equal(t, 1, st.Runs, "the operation must run exactly once")
			assert.Equal(t, map[idemtest.Fault]int{tt.fault: 1}, st.Faults)
			assert.Equal(t, map[string]int{"k1": 2}, st.AttemptsByKey)
		})
	}
}

func TestScriptPerAttempt(t *testing.T) {
	srv := idemtest.NewServer(&charger{},
		idemtest.WithRetryAfter(0),
		idemtest.WithScript(script(map[string][]idemtest.Fault{
			"k1": {idemtest.DropBefore, idemtest.Unavailable, idemtest.DropAfter, idemtest.InProgress},
			"k2": {idemtest.NoFault, idemtest.TooManyRequests},
		})))
	defer srv.Close()
	c := newClient(t)

	type outcome struct {
		err      bool
		status   int
		replayed bool
	}
	got := func(res result) outcome { return outcome{res.err != nil, res.status, res.err == nil && res.replayed()} }
	var k1, k2 []outcome
	for range 5 {
		k1 = append(k1, got(send(t, c, "POST", srv.URL+"/charges", "k1", "a")))
		k2 = append(k2, got(send(t, c, "POST", srv.URL+"/charges", "k2", "b")))
	}
	assert.Equal(t, []outcome{{err: true}, {status: 503}, {err: true}, {status: 409}, {status: 201, replayed: true}}, k1)
	assert.Equal(t, []outcome{{status: 201}, {status: 429}, {status: 201, replayed: true}, {status: 201, replayed: true}, {status: 201, replayed: true}}, k2)

	st := srv.Stats()
	assert.Equal(t, map[string]int{"k1": 1, "k2": 1}, st.RunsByKey)
	assert.Equal(t, map[idemtest.Fault]int{
		idemtest.DropBefore: 1, idemtest.Unavailable: 1, idemtest.DropAfter: 1,
		idemtest.InProgress: 1, idemtest.TooManyRequests: 1,
	}, st.Faults)
	assert.Equal(t, 4, st.Replays)
}

func TestFaultRatesReproducible(t *testing.T) {
	rates := func(seed uint64) idemtest.FaultRates {
		return idemtest.FaultRates{Seed: seed, DropBefore: 0.1, DropAfter: 0.1, Delay: 0.1,
			Unavailable: 0.1, TooManyRequests: 0.1, InProgress: 0.1}
	}
	// run sends 3 attempts for each of 20 keys, the keys in the given
	// order, and returns what the client saw per key and attempt.
	run := func(t *testing.T, seed uint64, reverse bool) (map[string][]string, idemtest.Stats) {
		srv := idemtest.NewServer(&charger{}, idemtest.WithFaultRates(rates(seed)),
			idemtest.WithFaultDelay(time.Millisecond), idemtest.WithRetryAfter(0))
		defer srv.Close()
		c := newClient(t)
		seen := make(map[string][]string)
		for i := range 20 {
			if reverse {
				i = 19 - i
			}
			key := fmt.Sprint("key-", i)
			for range 3 {
				res := send(t, c, "POST", srv.URL+"/charges", key, key)
				s := fmt.Sprint(res.status, " replayed=", res.replayed())
				if res.err != nil {
					s = "error"
				}
				seen[key] = append(seen[key], s)
			}
		}
		return seen, srv.Stats()
	}

	a, sa := run(t, 42, false)
	b, sb := run(t, 42, true)
	other, so := run(t, 43, false)
	assert.Equal(t, a, b, "same seed, other order: different faults")
	assert.Equal(t, sa.Faults, sb.Faults)
	assert.Equal(t, sa.RunsByKey, sb.RunsByKey)
	assert.NotEqual(t, so.Faults, sa.Faults, "another seed gave the same faults")
	assert.NotEqual(t, other, a)

	total := 0
	for f, n := range sa.Faults {
		assert.NotEqual(t, f, idemtest.NoFault)
		total += n
	}
	// 60 requests at 60%: a fixed seed gives a fixed count, so only check
	// that faults happened at a plausible rate and every kind showed up.
	assert.Len(t, sa.Faults, 6, "some fault kind never drawn: %v", sa.Faults)
	assert.InDelta(t, 36, total, 15, "faults in total")
	assert.Zero(t, sa.DuplicateKeys())
}

func TestScriptOverridesRates(t *testing.T) {
	srv := idemtest.NewServer(&charger{},
		idemtest.WithFaultRates(idemtest.FaultRates{Unavailable: 1}),
		idemtest.WithScript(script(map[string][]idemtest.Fault{"k1": {idemtest.TooManyRequests}})))
	defer srv.Close()
	c := newClient(t)
	assert.Equal(t, http.StatusTooManyRequests, send(t, c, "POST", srv.URL+"/x", "k1", "a").status)
	assert.Equal(t, http.StatusServiceUnavailable, send(t, c, "POST", srv.URL+"/x", "k1", "a").status)
}

func TestInvalidFaultRates(t *testing.T) {
	tests := []struct {
		name  string
		rates idemtest.FaultRates
	}{
		{"negative", idemtest.FaultRates{DropBefore: -0.1}},
		{"above one", idemtest.FaultRates{Delay: 1.5}},
		{"sum above one", idemtest.FaultRates{DropAfter: 0.6, InProgress: 0.6}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Panics(t, func() { idemtest.NewServer(&charger{}, idemtest.WithFaultRates(tt.rates)).Close() })
		})
	}
}

func TestCloseWakesDelayedRequest(t *testing.T) {
	arrived := make(chan struct{})
	srv := idemtest.NewServer(&charger{},
		idemtest.WithFaultDelay(time.Hour),
		idemtest.WithScript(func(string, int) idemtest.Fault {
			close(arrived)
			return idemtest.Delay
		}))
	c := newClient(t)
	resc := make(chan result, 1)
	go func() { resc <- send(t, c, "POST", srv.URL+"/charges", "k1", "a") }()
	<-arrived
	srv.Close() // would block for an hour if the delay were not woken
	assert.Error(t, (<-resc).err)
	assert.Zero(t, srv.Stats().Runs)
}

func TestBodyTooLarge(t *testing.T) {
	srv := idemtest.NewServer(&charger{})
	defer srv.Close()
	res := send(t, newClient(t), "POST", srv.URL+"/charges", "k1", strings.Repeat("x", idemtest.MaxBodyBytes+1))
	requireProblem(t, res, http.StatusRequestEntityTooLarge, idemtest.ProblemBodyTooLarge)
	assert.Zero(t, srv.Stats().Runs)
}

func TestConcurrentKeys(t *testing.T) {
	// Many clients retrying many keys through random faults: every key runs
	// exactly once and ends replayed or created. Run under -race.
	srv := idemtest.NewServer(&charger{}, idemtest.WithRetryAfter(0), idemtest.WithFaultDelay(time.Millisecond),
		idemtest.WithFaultRates(idemtest.FaultRates{Seed: 7, DropBefore: 0.1, DropAfter: 0.1, Delay: 0.05,
			Unavailable: 0.05, TooManyRequests: 0.05, InProgress: 0.05}))
	defer srv.Close()
	c := srv.Client()

	const workers, keys = 8, 200
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := range workers {
		wg.Go(func() {
			for i := w; i < keys; i += workers {
				key := fmt.Sprint("op-", i)
				ok := false
				for range 50 {
					req, _ := http.NewRequest("POST", srv.URL+"/charges", strings.NewReader(key))
					req.Header.Set("Idempotency-Key", key)
					resp, err := c.Do(req)
					if err != nil {
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode == http.StatusCreated {
						ok = true
						break
					}
				}
				if !ok {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	require.Zero(t, failed.Load(), "operations that never succeeded")
	st := srv.Stats()
	assert.Equal(t, keys, st.Runs)
	assert.Len(t, st.RunsByKey, keys)
	assert.Zero(t, st.DuplicateKeys())
	assert.Zero(t, st.DuplicatePayloads())
	assert.Greater(t, st.Requests, keys, "requests: faults caused retries")
}

// BenchmarkRoundTrip compares a round trip through a Server with one
// through a plain httptest.Server running the same handler. Compare the
// ns/op of the sub-benchmarks of one run.
func BenchmarkRoundTrip(b *testing.B) {
	h := &charger{}
	body := `{"amount":1000,"currency":"eur"}`
	bench := func(b *testing.B, url string, c *http.Client, key func() string) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				req, _ := http.NewRequest("POST", url+"/charges", strings.NewReader(body))
				if k := key(); k != "" {
					req.Header.Set("Idempotency-Key", k)
				}
				resp, err := c.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	var n atomic.Int64
	newKey := func() string { return fmt.Sprint("key-", n.Add(1)) }

	b.Run("httptest", func(b *testing.B) {
		srv := httptest.NewServer(h)
		defer srv.Close()
		bench(b, srv.URL, srv.Client(), func() string { return "" })
	})
	b.Run("idemtest/new-key", func(b *testing.B) {
		srv := idemtest.NewServer(h)
		defer srv.Close()
		bench(b, srv.URL, srv.Client(), newKey)
	})
	b.Run("idemtest/replay", func(b *testing.B) {
		srv := idemtest.NewServer(h)
		defer srv.Close()
		bench(b, srv.URL, srv.Client(), func() string { return "same" })
	})
}
