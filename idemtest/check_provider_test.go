package idemtest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemtest"
)

// goCardlessFake answers as GoCardless's idempotency keys do: the first
// request under a key creates a payment (201, its id); a repeat is 409
// invalid_state idempotent_creation_conflict naming the payment.
func goCardlessFake() http.Handler {
	var (
		mu      sync.Mutex
		created = map[string]string{}
	)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		id, ok := created[key]
		if !ok {
			id = fmt.Sprintf("PM%04d", len(created)+1)
			created[key] = id
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if !ok || key == "" {
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"payments":{"id":%q}}`, id)
			return
		}
		w.WriteHeader(http.StatusConflict)
		fmt.Fprintf(w, `{"error":{"code":409,"type":"invalid_state","errors":[{"reason":"idempotent_creation_conflict","links":{"conflicting_resource_id":%q}}]}}`, id)
	})
}

// squareFake answers as Square does: the key is the body's
// idempotency_key (missing: 400); a repeat replays the first answer.
func squareFake() http.Handler {
	var (
		mu   sync.Mutex
		seen = map[string]string{}
	)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req struct {
			Key string `json:"idempotency_key"`
		}
		if json.Unmarshal(b, &req) != nil || req.Key == "" {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"errors":[{"code":"MISSING_REQUIRED_PARAMETER"}]}`)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		answer, ok := seen[req.Key]
		if !ok {
			answer = fmt.Sprintf(`{"payment":{"id":"pay_%d"}}`, len(seen)+1)
			seen[req.Key] = answer
		}
		io.WriteString(w, answer)
	})
}

// checkWith runs the replay and cut-connection scenarios against h under
// profile p's rules, as idem check --provider does.
func checkWith(t *testing.T, h http.Handler, p *idem.Provider) map[string]idemtest.CheckResult {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	cfg := idemtest.CheckConfig{URL: srv.URL + "/payments", Body: `{"amount":100,"ref":"{{uuid}}"}`,
		Header: http.Header{"Content-Type": {"application/json"}}}
	if p != nil {
		cfg.KeyHeader, cfg.BodyKeyField, cfg.Busy = p.Header, p.BodyKeyField, p.InProgress
		cfg.Performed = func(status int, h http.Header, body []byte) bool {
			_, ok := p.PerformedAnswer(status, h, body)
			return ok
		}
	}
	rep, err := idemtest.Check(context.Background(), cfg)
	require.NoError(t, err)
	out := map[string]idemtest.CheckResult{}
	for _, r := range rep.Results {
		out[r.Scenario] = r
	}
	return out
}

// TestCheckUnderAProfile: GoCardless's conflict answer is a replay that
// is not a replay; under its profile the check reads it as the key
// honoured. Square's key travels in the body; under its profile the check
// puts it there.
func TestCheckUnderAProfile(t *testing.T) {
	plain := checkWith(t, goCardlessFake(), nil)
	assert.Equal(t, idemtest.Fail, plain[idemtest.ScenarioReplay].Verdict, "without the profile a 409 after a 201 is not a replay")
	gc := checkWith(t, goCardlessFake(), &idem.GoCardless)
	assert.Equal(t, idemtest.Pass, gc[idemtest.ScenarioReplay].Verdict, gc[idemtest.ScenarioReplay].Why)
	assert.Equal(t, idemtest.Pass, gc[idemtest.ScenarioCutConnection].Verdict, gc[idemtest.ScenarioCutConnection].Why)

	plain = checkWith(t, squareFake(), nil)
	assert.NotEqual(t, idemtest.Pass, plain[idemtest.ScenarioReplay].Verdict, "without the profile the key never reaches Square")
	sq := checkWith(t, squareFake(), &idem.Square)
	assert.Equal(t, idemtest.Pass, sq[idemtest.ScenarioReplay].Verdict, sq[idemtest.ScenarioReplay].Why)
}

// TestProviderReadsItsAnswers: the readings idem check takes from a
// profile.
func TestProviderReadsItsAnswers(t *testing.T) {
	h := http.Header{"Transient-Error": {"true"}}
	assert.True(t, idem.Adyen.InProgress(422, h, []byte(`{"status":422,"errorCode":"704"}`)))
	assert.False(t, idem.Adyen.InProgress(422, http.Header{}, []byte(`{"status":422,"errorCode":"14_030"}`)))
	p, ok := idem.GoCardless.PerformedAnswer(409, http.Header{}, []byte(`{"error":{"errors":[{"reason":"idempotent_creation_conflict","links":{"conflicting_resource_id":"PM1"}}]}}`))
	assert.True(t, ok)
	assert.Equal(t, "PM1", p.Resource)
	_, ok = idem.Stripe.PerformedAnswer(409, http.Header{}, []byte(`{}`))
	assert.False(t, ok)
}
