package idemtest_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemtest"
)

const checkBody = `{"amount":4200,"order":"{{uuid}}"}`

// verdicts returns each scenario's verdict.
func verdicts(rep idemtest.CheckReport) map[string]idemtest.Verdict {
	m := make(map[string]idemtest.Verdict)
	for _, r := range rep.Results {
		m[r.Scenario] = r.Verdict
	}
	return m
}

func runCheck(t *testing.T, url string, cfg idemtest.CheckConfig) idemtest.CheckReport {
	t.Helper()
	cfg.URL = url
	if cfg.Body == "" {
		cfg.Body = checkBody
	}
	rep, err := idemtest.Check(context.Background(), cfg)
	require.NoError(t, err)
	for _, r := range rep.Results {
		t.Logf("%-15s %-7s %s | %s | %s", r.Scenario, r.Verdict, r.Sent, r.Got, r.Why)
	}
	assert.LessOrEqual(t, rep.Requests, idemtest.MaxCheckRequests)
	return rep
}

// slowCharger charges after a pause, so that requests sent at once
// overlap.
func slowCharger() http.Handler {
	ch := &charger{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(50 * time.Millisecond)
		ch.ServeHTTP(w, r)
	})
}

func TestCheckPassesServer(t *testing.T) {
	srv := idemtest.NewServer(slowCharger(), idemtest.WithRetryAfter(0))
	defer srv.Close()
	rep := runCheck(t, srv.URL+"/v1/charges", idemtest.CheckConfig{})
	for _, r := range rep.Results {
		assert.Equal(t, idemtest.Pass, r.Verdict, "%s: %s", r.Scenario, r.Why)
	}
	assert.True(t, rep.Conforms)
	assert.Empty(t, rep.Failed())
	assert.Zero(t, srv.Stats().DuplicateKeys(), "the check itself performed no operation twice")
}

// keyless performs every request, whatever its key.
func keyless() *httptest.Server {
	return httptest.NewServer(&charger{})
}

func TestCheckFailsServerThatIgnoresKeys(t *testing.T) {
	srv := keyless()
	defer srv.Close()
	rep := runCheck(t, srv.URL, idemtest.CheckConfig{})
	v := verdicts(rep)
	assert.Equal(t, idemtest.Fail, v[idemtest.ScenarioReplay])
	assert.Equal(t, idemtest.Fail, v[idemtest.ScenarioOtherPayload])
	assert.Equal(t, idemtest.Fail, v[idemtest.ScenarioConcurrent])
	assert.Equal(t, idemtest.Fail, v[idemtest.ScenarioCutConnection])
	assert.False(t, rep.Conforms)
}

// lenient honours keys but answers another payload under a used key with
// the stored answer and 200, as some providers document.
type lenient struct {
	mu   sync.Mutex
	keys map[string][]byte
	ch   charger
}

func (l *lenient) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	l.mu.Lock()
	defer l.mu.Unlock()
	if b, ok := l.keys[key]; ok {
		w.Header().Set("Idempotent-Replayed", "true")
		w.Write(b)
		return
	}
	rec := httptest.NewRecorder()
	l.ch.ServeHTTP(rec, r)
	l.keys[key] = rec.Body.Bytes()
	w.Write(rec.Body.Bytes())
}

func TestCheckFailsServerThatAcceptsOtherPayload(t *testing.T) {
	srv := httptest.NewServer(&lenient{keys: make(map[string][]byte)})
	defer srv.Close()
	rep := runCheck(t, srv.URL, idemtest.CheckConfig{})
	v := verdicts(rep)
	assert.Equal(t, idemtest.Fail, v[idemtest.ScenarioOtherPayload])
	assert.Equal(t, []string{idemtest.ScenarioOtherPayload}, rep.Failed())
	assert.Equal(t, idemtest.Pass, v[idemtest.ScenarioReplay])
}

func TestCheckFailsServerThatForgetsKeys(t *testing.T) {
	srv := idemtest.NewServer(&charger{}, idemtest.WithRetention(time.Second), idemtest.WithRetryAfter(0))
	defer srv.Close()
	rep := runCheck(t, srv.URL, idemtest.CheckConfig{WaitRetention: 2 * time.Second})
	v := verdicts(rep)
	assert.Equal(t, idemtest.Fail, v[idemtest.ScenarioRetention])
	assert.Equal(t, []string{idemtest.ScenarioRetention}, rep.Failed())
}

func TestCheckRetentionPassesServerThatKeepsKeys(t *testing.T) {
	srv := idemtest.NewServer(&charger{}, idemtest.WithRetryAfter(0))
	defer srv.Close()
	rep := runCheck(t, srv.URL, idemtest.CheckConfig{WaitRetention: 100 * time.Millisecond})
	assert.Equal(t, idemtest.Pass, verdicts(rep)[idemtest.ScenarioRetention])
	assert.True(t, rep.Conforms)
}

// TestCheckUnknownWhenAnswersAreAllAlike checks that a server whose
// answers never differ is not taken for one that replays.
func TestCheckUnknownWhenAnswersAreAllAlike(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte(`{"ok":true}`))
	}))
	defer srv.Close()
	rep := runCheck(t, srv.URL, idemtest.CheckConfig{Body: `{"amount":1}`})
	v := verdicts(rep)
	assert.Equal(t, idemtest.Unknown, v[idemtest.ScenarioReplay])
	assert.Equal(t, idemtest.Unknown, v[idemtest.ScenarioOtherPayload], "no other body given")
	assert.NotEqual(t, idemtest.Pass, v[idemtest.ScenarioConcurrent])
	assert.Equal(t, idemtest.Unknown, v[idemtest.ScenarioCutConnection])
	assert.False(t, rep.Conforms)
}

// TestCheckUnknownWhenRequestRefused checks that a request the endpoint
// refuses outright (a bad body, missing credentials) is not judged.
func TestCheckUnknownWhenRequestRefused(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":"invalid api key"}`, http.StatusUnauthorized)
	}))
	defer srv.Close()
	rep := runCheck(t, srv.URL, idemtest.CheckConfig{})
	v := verdicts(rep)
	assert.Equal(t, idemtest.Unknown, v[idemtest.ScenarioReplay])
	assert.Contains(t, rep.Results[0].Why, "401")
	assert.Empty(t, rep.Failed())
	assert.False(t, rep.Conforms)
}

// TestCheckSendsFreshUUIDsPerOperation records the bodies and keys sent:
// each logical operation has its own key and UUID, its requests share
// them, and the other-payload request reuses the first key with another
// UUID.
func TestCheckSendsFreshUUIDsPerOperation(t *testing.T) {
	var (
		mu    sync.Mutex
		byKey = make(map[string]map[string]bool)
		n     atomic.Int32
	)
	inner := idemtest.NewServer(&charger{}, idemtest.WithRetryAfter(0), idemtest.WithKeyHeader("PayPal-Request-Id"))
	defer inner.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		b, _ := io.ReadAll(r.Body)
		assert.NotContains(t, string(b), "{{uuid}}")
		assert.Equal(t, "secret", r.Header.Get("Authorization"))
		k := r.Header.Get("PayPal-Request-Id")
		mu.Lock()
		if byKey[k] == nil {
			byKey[k] = make(map[string]bool)
		}
		byKey[k][fmt.Sprintf("%x", sha256.Sum256(b))] = true
		mu.Unlock()
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, inner.URL+r.URL.Path, bytes.NewReader(b))
		req.Header = r.Header.Clone()
		resp, err := inner.Client().Do(req)
		if err != nil {
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	}))
	defer srv.Close()
	rep := runCheck(t, srv.URL, idemtest.CheckConfig{
		KeyHeader: "PayPal-Request-Id",
		Header:    http.Header{"Authorization": {"secret"}},
	})
	assert.True(t, rep.Conforms)
	srv.Close() // every handler has run
	mu.Lock()
	defer mu.Unlock()
	two := 0
	for k, bodies := range byKey {
		require.NotEmpty(t, k)
		if len(bodies) == 2 {
			two++ // the first operation, and the other payload under its key
		}
		assert.LessOrEqual(t, len(bodies), 2)
	}
	assert.Equal(t, 1, two, "only the other-payload scenario sends a key with a second body")
	// The cut request may have reached the server after Check returned,
	// or never been read by it.
	assert.InDelta(t, rep.Requests, int(n.Load()), 1, "the report counts what was sent")
	assert.LessOrEqual(t, int(n.Load()), rep.Requests)
}

func TestCheckRefusesBadConfig(t *testing.T) {
	for _, u := range []string{"", "ftp://x/y", "http://", "::"} {
		_, err := idemtest.Check(context.Background(), idemtest.CheckConfig{URL: u})
		assert.Error(t, err, u)
	}
}

func TestCheckBoundsRequests(t *testing.T) {
	srv := keyless()
	defer srv.Close()
	rep := runCheck(t, srv.URL, idemtest.CheckConfig{Concurrency: 100, WaitRetention: time.Millisecond})
	assert.LessOrEqual(t, rep.Requests, idemtest.MaxCheckRequests)
}
