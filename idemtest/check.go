package idemtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// MaxCheckRequests bounds the requests one Check sends, whatever its
// configuration: a scenario that would need more is reported unknown.
const MaxCheckRequests = 32

// Defaults of CheckConfig.
const (
	// DefaultCheckConcurrency is how many requests with one key the
	// concurrent scenario sends at once.
	DefaultCheckConcurrency = 5
	// MaxCheckConcurrency caps CheckConfig.Concurrency.
	MaxCheckConcurrency = 10
	// DefaultCheckTimeout bounds each request.
	DefaultCheckTimeout = 30 * time.Second
)

// UUIDPlaceholder in a body is replaced by a fresh UUID per logical
// operation, so that repeated runs do not collide with earlier ones.
const UUIDPlaceholder = "{{uuid}}"

// CheckConfig says what Check sends, and where.
type CheckConfig struct {
	// URL is the endpoint under test, for example a sandbox's
	// https://api.sandbox.example/v1/payments.
	URL string
	// Method is the request method. Empty means POST.
	Method string
	// Header is sent with every request (credentials, Content-Type).
	Header http.Header
	// Body is the request body. Every UUIDPlaceholder in it is replaced by
	// a fresh UUID per logical operation.
	Body string
	// OtherBody is the other payload sent under a used key. Empty means
	// Body with fresh UUIDs, if Body has UUIDPlaceholder; otherwise the
	// other-payload scenario is unknown.
	OtherBody string
	// KeyHeader is the request header that carries the key. Empty means
	// DefaultKeyHeader.
	KeyHeader string
	// NewKey returns a fresh key per logical operation. Nil means a random
	// UUID.
	NewKey func() string
	// BodyKeyField, if not empty, also puts the key in the JSON object
	// body's top-level member of that name (Square's idempotency_key), as
	// idem.Provider.BodyKeyField has idem do.
	BodyKeyField string
	// Busy, if set, reports answers besides 409 and 429 that mean "a
	// request with this key is still in progress: ask again" (Adyen's 704
	// on a 422), as a provider profile reads them.
	Busy func(status int, h http.Header, body []byte) bool
	// Performed, if set, reports an answer that means "a request under
	// this key was performed, and its answer is not replayed"
	// (GoCardless's 409 idempotent_creation_conflict): the replay and
	// cut-connection scenarios pass on it, since the server honoured the
	// key.
	Performed func(status int, h http.Header, body []byte) bool
	// Concurrency is how many requests with one key are sent at once.
	// Zero means DefaultCheckConcurrency; it is capped at
	// MaxCheckConcurrency.
	Concurrency int
	// WaitRetention, if positive, adds the retention scenario: an
	// operation is sent, and sent again WaitRetention later; the key must
	// still be honoured.
	WaitRetention time.Duration
	// Timeout bounds each request. Zero means DefaultCheckTimeout.
	Timeout time.Duration
	// Client sends the requests. Nil means a client of its own that
	// follows no redirects. Check uses it as it is; give it no retries of
	// its own.
	Client *http.Client
}

// Verdict is a scenario's result.
type Verdict string

// The verdicts.
const (
	// Pass: the answers conform.
	Pass Verdict = "pass"
	// Fail: an answer shows that the server does not honour keys as the
	// scenario requires.
	Fail Verdict = "fail"
	// Unknown: the answers cannot tell (no answer, an error unrelated to
	// keys, answers that cannot tell operations apart, the request bound).
	Unknown Verdict = "unknown"
)

// The scenarios, in the order Check runs them.
const (
	ScenarioReplay        = "replay"         // same request twice with one key
	ScenarioOtherPayload  = "other-payload"  // another payload with a used key
	ScenarioConcurrent    = "concurrent"     // N at once with one key
	ScenarioCutConnection = "cut-connection" // connection cut, then retried
	ScenarioReplayMarker  = "replay-marker"  // does a header mark the replay?
	ScenarioRetention     = "retention"      // resent after WaitRetention
)

// CheckResult is one scenario's outcome.
type CheckResult struct {
	// Scenario is one of the Scenario names.
	Scenario string `json:"scenario"`
	// Sent says what was sent, and Got what came back, in a few words.
	Sent string `json:"sent"`
	Got  string `json:"got"`
	// Verdict is the judgement, and Why its reason.
	Verdict Verdict `json:"verdict"`
	Why     string  `json:"why"`
	// Requests counts the requests the scenario sent.
	Requests int `json:"requests"`
	// Informational scenarios (the replay marker) do not make a report
	// non-conforming unless they fail.
	Informational bool `json:"informational,omitempty"`
}

// CheckReport is what Check found.
type CheckReport struct {
	Method  string        `json:"method"`
	URL     string        `json:"url"`
	Results []CheckResult `json:"results"`
	// Requests counts every request sent (at most MaxCheckRequests).
	Requests int `json:"requests"`
	// Conforms is true when every scenario passed, informational ones
	// excepted (they must only not fail).
	Conforms bool `json:"conforms"`
}

// Failed returns the names of the scenarios that failed.
func (r CheckReport) Failed() []string {
	var out []string
	for _, s := range r.Results {
		if s.Verdict == Fail {
			out = append(out, s.Scenario)
		}
	}
	return out
}

// Check runs the seeds' test plan for idempotent APIs against one
// endpoint, judging only from the answers:
//
//   - replay: the same request twice with one key; the second answer must
//     repeat the first's status and body. A control operation (another
//     key, fresh UUIDs) must be answered differently, else identical
//     answers prove nothing and the verdict is unknown;
//   - other-payload: another payload under the used key must not get a
//     2xx;
//   - concurrent: Concurrency requests with one key at once; at most one
//     performs: the others get 409 (or 429) or the same answer, and a
//     request after the burst repeats it;
//   - cut-connection: a request whose connection is cut right after it
//     was written, then retried with its key (409 and 5xx answers are
//     retried a few times); the retry must be answered, and a further
//     retry must repeat that answer;
//   - replay-marker (informational): a response header that marks the
//     replay and not the first answer (Idempotent-Replayed: true, ...);
//   - retention (with WaitRetention only): an operation resent after
//     WaitRetention must still be replayed, or refused, not performed
//     again.
//
// Each logical operation has its own key and its own UUIDs. Check sends at
// most MaxCheckRequests requests. It cannot see effects the server forgot
// itself (a cut request performed and then performed again by its retry,
// while the server kept only the second): count the effects in the
// sandbox's dashboard too.
//
// Check returns an error only for a configuration it cannot run (no URL,
// a URL that is not http or https) or when ctx ends; every finding is in
// the report.
func Check(ctx context.Context, cfg CheckConfig) (CheckReport, error) {
	c, err := newChecker(cfg)
	if err != nil {
		return CheckReport{}, err
	}
	defer c.client.CloseIdleConnections()
	rep := CheckReport{Method: c.method, URL: cfg.URL}

	var ret *retentionRun
	if cfg.WaitRetention > 0 {
		ret = c.startRetention(ctx)
	}
	replay, first, second, distinct := c.replay(ctx)
	rep.Results = append(rep.Results,
		replay,
		c.otherPayload(ctx, first),
		c.concurrent(ctx, distinct),
		c.cutConnection(ctx, distinct),
		c.replayMarker(replay, first, second),
	)
	if ret != nil {
		rep.Results = append(rep.Results, c.finishRetention(ctx, ret))
	}
	if err := ctx.Err(); err != nil {
		return rep, context.Cause(ctx)
	}
	rep.Requests = int(c.sent.Load())
	rep.Conforms = true
	for _, r := range rep.Results {
		if r.Verdict == Fail || r.Verdict == Unknown && !r.Informational {
			rep.Conforms = false
		}
	}
	return rep, nil
}

// checker runs one Check.
type checker struct {
	cfg     CheckConfig
	method  string
	header  string
	client  *http.Client
	timeout time.Duration
	n       int
	sent    atomic.Int32
	first   op // the replay scenario's operation, whose key other-payload reuses
}

func newChecker(cfg CheckConfig) (*checker, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("idemtest: check: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("idemtest: check: URL %q is not an http or https URL with a host", cfg.URL)
	}
	c := &checker{cfg: cfg, method: strings.ToUpper(cfg.Method), header: cfg.KeyHeader, client: cfg.Client, timeout: cfg.Timeout, n: cfg.Concurrency}
	if c.method == "" {
		c.method = http.MethodPost
	}
	if c.header == "" {
		c.header = DefaultKeyHeader
	}
	if c.timeout <= 0 {
		c.timeout = DefaultCheckTimeout
	}
	if c.n <= 0 {
		c.n = DefaultCheckConcurrency
	}
	c.n = min(max(c.n, 2), MaxCheckConcurrency)
	if c.client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = MaxCheckConcurrency
		c.client = &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	return c, nil
}

// op is one logical operation: its key and body.
type op struct {
	key  string
	body string
}

// newOp returns a fresh logical operation with body template tmpl.
func (c *checker) newOp(tmpl string) op {
	key := ""
	if c.cfg.NewKey != nil {
		key = c.cfg.NewKey()
	}
	if key == "" {
		key = uuid.NewString()
	}
	return op{key: key, body: fillUUIDs(tmpl)}
}

// fillUUIDs replaces each UUIDPlaceholder in s by a fresh UUID; every
// placeholder gets the same one, so a body may name it twice.
func fillUUIDs(s string) string {
	if !strings.Contains(s, UUIDPlaceholder) {
		return s
	}
	return strings.ReplaceAll(s, UUIDPlaceholder, uuid.NewString())
}

// answer is what came back for one request.
type answer struct {
	status int
	header http.Header
	body   []byte
	err    error
	// inProgress and performed are the profile's reading (CheckConfig's
	// Busy and Performed).
	inProgress, performed bool
}

// maxAnswer bounds how much of an answer's body is kept.
const maxAnswer = 1 << 20

// errBound says the request bound is spent.
var errBound = fmt.Errorf("request bound (%d) reached", MaxCheckRequests)

// send sends o once. With cut, the connection is closed as soon as the
// request is written, and the answer, if any, is never read.
func (c *checker) send(ctx context.Context, o op, cut bool) answer {
	if c.sent.Add(1) > MaxCheckRequests {
		c.sent.Add(-1)
		return answer{err: errBound}
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	if cut {
		var cutNow context.CancelFunc
		ctx, cutNow = context.WithCancel(ctx)
		defer cutNow()
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
			WroteRequest: func(httptrace.WroteRequestInfo) { cutNow() },
		})
	}
	body := o.body
	if f := c.cfg.BodyKeyField; f != "" {
		body = withBodyKey(body, f, o.key)
	}
	req, err := http.NewRequestWithContext(ctx, c.method, c.cfg.URL, strings.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	for k, vs := range c.cfg.Header {
		req.Header[http.CanonicalHeaderKey(k)] = append([]string(nil), vs...)
	}
	req.Header.Set(c.header, o.key)
	resp, err := c.client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if cut {
		return answer{err: errors.New("connection cut")}
	}
	a := answer{status: resp.StatusCode, header: resp.Header, body: b, err: err}
	if err == nil {
		a.inProgress = c.cfg.Busy != nil && c.cfg.Busy(a.status, a.header, a.body)
		a.performed = c.cfg.Performed != nil && c.cfg.Performed(a.status, a.header, a.body)
	}
	return a
}

// withBodyKey returns body, a JSON object, with "field":key as its first
// member, or body as it is when it is not an object or has the member.
func withBodyKey(body, field, key string) string {
	var obj map[string]json.RawMessage
	if json.Unmarshal([]byte(body), &obj) != nil || obj == nil {
		return body
	}
	if _, ok := obj[field]; ok {
		return body
	}
	member, _ := json.Marshal(map[string]string{field: key})
	i := strings.IndexByte(body, '{')
	inner := string(member[1 : len(member)-1])
	if rest := strings.TrimSpace(body[i+1:]); !strings.HasPrefix(rest, "}") {
		inner += ","
	}
	return body[:i+1] + inner + body[i+1:]
}

// busy reports an answer that asks to come back later: 409 "in progress",
// or 429 as some providers send for a concurrent request.
func (a answer) busy() bool {
	return a.err == nil && !a.performed && (a.status == http.StatusConflict || a.status == http.StatusTooManyRequests || a.inProgress)
}

func (a answer) ok() bool { return a.err == nil && a.status >= 200 && a.status < 300 }

// same reports whether b repeats a's status and body.
func (a answer) same(b answer) bool {
	return a.err == nil && b.err == nil && a.status == b.status && bytes.Equal(a.body, b.body)
}

// retryWait is how long to wait before asking again after a: the
// server's Retry-After, but at least try × 250ms (a server may say 0 while
// it still runs the request), and at most 2 seconds.
func retryWait(a answer, try int) time.Duration {
	d := time.Duration(try) * 250 * time.Millisecond
	if a.err == nil {
		if s, err := strconv.Atoi(strings.TrimSpace(a.header.Get("Retry-After"))); err == nil && s >= 0 {
			d = max(d, time.Duration(s)*time.Second)
		}
	}
	return min(d, 2*time.Second)
}

// sendSettled sends o until an answer is not busy nor a 5xx nor missing,
// at most tries times, and returns the last answer and how many were
// sent.
func (c *checker) sendSettled(ctx context.Context, o op, tries int) (answer, int) {
	var a answer
	for i := 1; i <= tries; i++ {
		a = c.send(ctx, o, false)
		if errors.Is(a.err, errBound) {
			return a, i - 1
		}
		if !a.busy() && a.err == nil && a.status < 500 || i == tries {
			return a, i
		}
		t := time.NewTimer(retryWait(a, i))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return answer{err: context.Cause(ctx)}, i
		}
	}
	return a, tries
}

// String describes a in a few words: "201 (312 B)" or the error.
func (a answer) String() string {
	if a.err != nil {
		return "no answer: " + shortErr(a.err)
	}
	return fmt.Sprintf("%d (%d B)", a.status, len(a.body))
}

// shortErr drops the request's method and URL from a client error.
func shortErr(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return err.Error()
}

// diff says where b's body first differs from a's, with a little of
// each.
func diff(a, b []byte) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	snip := func(s []byte) string {
		from, to := max(i-16, 0), min(i+16, len(s))
		if from >= to {
			return `""`
		}
		return strconv.Quote(string(s[from:to]))
	}
	return fmt.Sprintf("bodies differ at byte %d: %s vs %s", i, snip(a), snip(b))
}

// excerpt returns the start of a body, for a why.
func excerpt(b []byte) string {
	s := strings.Join(strings.Fields(string(b)), " ")
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	return strconv.Quote(s)
}
