package idemtest_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	if err != nil {
		t.Errorf("new request: %v", err)
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
	mustNoError(t, res.err)
	mustEqual(t, res.status, status, "body: %s", res.body)
	equal(t, res.header.Get("Content-Type"), "application/problem+json")
	var p problemDoc
	mustNoError(t, json.Unmarshal([]byte(res.body), &p))
	equal(t, p.Type, typ)
	equal(t, p.Status, status)
	isTrue(t, p.Title != "", "p.Title is empty")
	isTrue(t, p.Detail != "", "p.Detail is empty")
}

func TestReplay(t *testing.T) {
	srv := idemtest.NewServer(&charger{})
	defer srv.Close()
	c := newClient(t)

	first := send(t, c, "POST", srv.URL+"/charges", "k1", `{"amount":100}`)
	mustNoError(t, first.err)
	mustEqual(t, first.status, http.StatusCreated)
	equal(t, first.replayed(), false, "first answer replayed")

	for i := range 2 {
		again := send(t, c, "POST", srv.URL+"/charges", "k1", `{"amount":100}`)
		mustNoError(t, again.err)
		equal(t, again.status, first.status, "replay %d", i)
		equal(t, again.body, first.body, "replay %d", i)
		equal(t, again.header.Get("X-Charge-Id"), first.header.Get("X-Charge-Id"), "replay %d", i)
		equal(t, again.header.Get("Content-Type"), "application/json", "replay %d", i)
		equal(t, again.replayed(), true, "replay %d replayed", i)
	}

	st := srv.Stats()
	equal(t, st.Runs, 1)
	equal(t, st.RunsByKey, map[string]int{"k1": 1})
	equal(t, st.AttemptsByKey, map[string]int{"k1": 3})
	equal(t, st.RunsByPayload, map[string]int{idemtest.Fingerprint("POST", "/charges", []byte(`{"amount":100}`)): 1})
	equal(t, st.Requests, 3)
	equal(t, st.Replays, 2)
	equal(t, st.DuplicateKeys(), 0)
	equal(t, st.DuplicatePayloads(), 0)
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
				mustNoError(t, err)
				req.Header.Set(header, key)
				resp, err := c.Do(req)
				mustNoError(t, err)
				defer resp.Body.Close()
				io.Copy(io.Discard, resp.Body)
				return result{status: resp.StatusCode, header: resp.Header}
			}

			first := do("POST", "/a", "k")
			second := do(tt.method, tt.path, tt.key)
			mustEqual(t, first.status, http.StatusCreated)
			mustEqual(t, second.status, http.StatusCreated)
			equal(t, second.replayed(), tt.wantReplay)
			wantRuns := 2
			if tt.wantReplay {
				wantRuns = 1
			}
			equal(t, srv.Stats().Runs, wantRuns)
		})
	}
}

func TestPayloadMismatch(t *testing.T) {
	srv := idemtest.NewServer(&charger{})
	defer srv.Close()
	c := newClient(t)

	mustEqual(t, send(t, c, "POST", srv.URL+"/charges", "k1", `{"amount":100}`).status, http.StatusCreated)
	requireProblem(t, send(t, c, "POST", srv.URL+"/charges", "k1", `{"amount":999}`),
		http.StatusUnprocessableEntity, idemtest.ProblemKeyMismatch)
	requireProblem(t, send(t, c, "POST", srv.URL+"/charges?currency=eur", "k1", `{"amount":100}`),
		http.StatusUnprocessableEntity, idemtest.ProblemKeyMismatch)
	// The original payload is still replayed.
	equal(t, send(t, c, "POST", srv.URL+"/charges", "k1", `{"amount":100}`).replayed(), true, "replayed")

	st := srv.Stats()
	equal(t, st.Runs, 1)
	equal(t, st.Mismatches, 2)
	equal(t, st.Replays, 1)
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
			equal(t, busy.header.Get("Retry-After"), tt.wantRetryAfter)
			// A different payload is a mismatch even while the first runs.
			requireProblem(t, send(t, c, "POST", srv.URL+"/charges", "k1", "b"),
				http.StatusUnprocessableEntity, idemtest.ProblemKeyMismatch)

			unblock()
			first := <-firstc
			mustNoError(t, first.err)
			equal(t, first.status, http.StatusCreated)

			after := send(t, c, "POST", srv.URL+"/charges", "k1", "a")
			equal(t, after.replayed(), true, "replayed")
			equal(t, after.body, first.body)

			st := srv.Stats()
			equal(t, st.Runs, 1)
			equal(t, st.Conflicts, 1)
			equal(t, st.Faults[idemtest.InProgress], 0, "a real conflict counted as a fault")
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
			mustEqual(t, first.status, tt.status)
			retry := send(t, c, "POST", srv.URL+"/charges", "k1", "a")
			mustNoError(t, retry.err)
			if tt.stored {
				equal(t, retry.status, tt.status)
				equal(t, retry.body, "first")
				equal(t, retry.replayed(), true, "replayed")
				equal(t, srv.Stats().RunsByKey["k1"], 1)
			} else {
				equal(t, retry.status, http.StatusCreated)
				equal(t, retry.body, "second")
				equal(t, retry.replayed(), false, "replayed")
				equal(t, srv.Stats().RunsByKey["k1"], 2)
				equal(t, srv.Stats().DuplicateKeys(), 1)
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

	isError(t, send(t, c, "POST", srv.URL+"/charges", "k1", "a").err)
	retry := send(t, c, "POST", srv.URL+"/charges", "k1", "a")
	mustNoError(t, retry.err)
	equal(t, retry.status, http.StatusCreated, "key still held after the handler panicked")
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
					mustNoError(t, res.err)
					equal(t, res.status, tt.want)
					equal(t, res.replayed(), false, "replayed")
				}
			}
			st := srv.Stats()
			if tt.want == http.StatusBadRequest {
				equal(t, st.MissingKeys, 2)
				equal(t, st.Runs, 0)
			} else {
				equal(t, st.Runs, 2)
				equal(t, st.RunsByKey, map[string]int{"": 2})
				equal(t, st.DuplicateKeys(), 0, "requests without a key counted as a duplicate key")
				equal(t, st.DuplicatePayloads(), 1)
			}
			equal(t, st.AttemptsByKey, map[string]int{"": 2})
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
			mustEqual(t, first.status, http.StatusCreated)
			clk.Advance(tt.advance)
			again := send(t, c, "POST", srv.URL+"/charges", "k1", "a")
			mustEqual(t, again.status, http.StatusCreated)
			equal(t, again.replayed(), tt.wantReplay)
			wantRuns := 2
			if tt.wantReplay {
				wantRuns = 1
			}
			equal(t, srv.Stats().RunsByKey["k1"], wantRuns)
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
		mustEqual(t, send(t, c, "POST", srv.URL+"/charges", fmt.Sprint("k", i), "a").status, http.StatusCreated)
	}
	// The last hour stored 50 keys; up to max(keys held, 64) more may wait
	// for the next sweep.
	st := srv.Stats()
	isTrue(t, st.Keys >= 50 && st.Keys <= 50+64+1, "holding %d keys after 200 stores, want 50 to 115", st.Keys)
	equal(t, send(t, c, "POST", srv.URL+"/charges", "k199", "a").replayed(), true, "replayed")
	equal(t, send(t, c, "POST", srv.URL+"/charges", "k0", "a").replayed(), false, "replayed")
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
				mustError(t, first.err, "status %d", first.status)
			} else {
				mustNoError(t, first.err)
				equal(t, first.status, tt.wantStatus)
				if tt.wantProblem != "" {
					requireProblem(t, first, tt.wantStatus, tt.wantProblem)
				}
				equal(t, first.header.Get("Retry-After"), tt.wantRetryAfter)
			}
			equal(t, srv.Stats().Runs, tt.wantRuns, "runs after the faulty attempt")

			retry := send(t, c, "POST", srv.URL+"/charges", "k1", "a")
			mustNoError(t, retry.err)
			equal(t, retry.status, http.StatusCreated)
			equal(t, retry.replayed(), tt.wantReplay)

			st := srv.Stats()
			equal(t, st.Runs, 1, "the operation must run exactly once")
			equal(t, st.Faults, map[idemtest.Fault]int{tt.fault: 1})
			equal(t, st.AttemptsByKey, map[string]int{"k1": 2})
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
	equal(t, k1, []outcome{{err: true}, {status: 503}, {err: true}, {status: 409}, {status: 201, replayed: true}})
	equal(t, k2, []outcome{{status: 201}, {status: 429}, {status: 201, replayed: true}, {status: 201, replayed: true}, {status: 201, replayed: true}})

	st := srv.Stats()
	equal(t, st.RunsByKey, map[string]int{"k1": 1, "k2": 1})
	equal(t, st.Faults, map[idemtest.Fault]int{
		idemtest.DropBefore: 1, idemtest.Unavailable: 1, idemtest.DropAfter: 1,
		idemtest.InProgress: 1, idemtest.TooManyRequests: 1,
	})
	equal(t, st.Replays, 4)
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
	equal(t, b, a, "same seed, other order: different faults")
	equal(t, sb.Faults, sa.Faults)
	equal(t, sb.RunsByKey, sa.RunsByKey)
	notEqual(t, sa.Faults, so.Faults, "another seed gave the same faults")
	notEqual(t, a, other)

	total := 0
	for f, n := range sa.Faults {
		notEqual(t, idemtest.NoFault, f)
		total += n
	}
	// 60 requests at 60%: a fixed seed gives a fixed count, so only check
	// that faults happened at a plausible rate and every kind showed up.
	equal(t, len(sa.Faults), 6, "some fault kind never drawn: %v", sa.Faults)
	isTrue(t, total >= 36-15 && total <= 36+15, "total = %d, want %d ± %d", total, 36, 15)
	equal(t, sa.DuplicateKeys(), 0)
}

func TestScriptOverridesRates(t *testing.T) {
	srv := idemtest.NewServer(&charger{},
		idemtest.WithFaultRates(idemtest.FaultRates{Unavailable: 1}),
		idemtest.WithScript(script(map[string][]idemtest.Fault{"k1": {idemtest.TooManyRequests}})))
	defer srv.Close()
	c := newClient(t)
	equal(t, send(t, c, "POST", srv.URL+"/x", "k1", "a").status, http.StatusTooManyRequests)
	equal(t, send(t, c, "POST", srv.URL+"/x", "k1", "a").status, http.StatusServiceUnavailable)
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
			panics(t, func() { idemtest.NewServer(&charger{}, idemtest.WithFaultRates(tt.rates)).Close() })
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
	isError(t, (<-resc).err)
	equal(t, srv.Stats().Runs, 0)
}

func TestBodyTooLarge(t *testing.T) {
	srv := idemtest.NewServer(&charger{})
	defer srv.Close()
	res := send(t, newClient(t), "POST", srv.URL+"/charges", "k1", strings.Repeat("x", idemtest.MaxBodyBytes+1))
	requireProblem(t, res, http.StatusRequestEntityTooLarge, idemtest.ProblemBodyTooLarge)
	equal(t, srv.Stats().Runs, 0)
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
	mustEqual(t, failed.Load(), 0, "operations that never succeeded")
	st := srv.Stats()
	equal(t, st.Runs, keys)
	equal(t, len(st.RunsByKey), keys)
	equal(t, st.DuplicateKeys(), 0)
	equal(t, st.DuplicatePayloads(), 0)
	isTrue(t, st.Requests > keys, "st.Requests = %d, want more than %d", st.Requests, keys)
}

// The helpers below report failures got-versus-want; the must forms stop
// the test.

func msgOf(msg []any) string {
	if len(msg) == 0 {
		return ""
	}
	return fmt.Sprintf(msg[0].(string), msg[1:]...) + ": "
}

func equal[T any](t *testing.T, got, want T, msg ...any) bool {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%sgot %v, want %v", msgOf(msg), got, want)
		return false
	}
	return true
}

func mustEqual[T any](t *testing.T, got, want T, msg ...any) {
	t.Helper()
	if !equal(t, got, want, msg...) {
		t.FailNow()
	}
}

func notEqual[T any](t *testing.T, got, other T, msg ...any) {
	t.Helper()
	if reflect.DeepEqual(got, other) {
		t.Errorf("%sgot %v, want anything else", msgOf(msg), got)
	}
}

func isTrue(t *testing.T, cond bool, msg ...any) {
	t.Helper()
	if !cond {
		t.Errorf("%scondition is false", msgOf(msg))
	}
}

func mustNoError(t *testing.T, err error, msg ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%sunexpected error: %v", msgOf(msg), err)
	}
}

func isError(t *testing.T, err error, msg ...any) {
	t.Helper()
	if err == nil {
		t.Errorf("%sgot no error, want one", msgOf(msg))
	}
}

func mustError(t *testing.T, err error, msg ...any) {
	t.Helper()
	if err == nil {
		t.Fatalf("%sgot no error, want one", msgOf(msg))
	}
}

func panics(t *testing.T, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("did not panic")
		}
	}()
	f()
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
