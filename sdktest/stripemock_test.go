package sdktest_test

import (
	"bufio"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemtest"
)

// findStripeMock returns the stripe-mock binary on PATH or in
// $(go env GOPATH)/bin, or "".
func findStripeMock() string {
	if p, err := exec.LookPath("stripe-mock"); err == nil {
		return p
	}
	out, err := exec.Command("go", "env", "GOPATH").Output()
	if err != nil {
		return ""
	}
	for _, dir := range filepath.SplitList(strings.TrimSpace(string(out))) {
		p := filepath.Join(dir, "bin", "stripe-mock")
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p
		}
	}
	return ""
}

// startStripeMock starts stripe-mock on loopback ports of its choosing and
// returns its HTTP base URL; the test's cleanup stops it.
func startStripeMock(t *testing.T) string {
	t.Helper()
	bin := findStripeMock()
	if bin == "" {
		if os.Getenv("CI") == "true" { // .ci/run installs it
			t.Fatal("stripe-mock not on PATH nor in $(go env GOPATH)/bin, and CI=true: .ci/run installs it")
		}
		t.Skip("stripe-mock not on PATH nor in $(go env GOPATH)/bin; install it: go install github.com/stripe/stripe-mock@v0.197.0")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "-http-addr", "127.0.0.1:0", "-https-addr", "127.0.0.1:0")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	addr := make(chan string, 1)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		sc := bufio.NewScanner(out)
		for sc.Scan() { // keep reading, or stripe-mock blocks on its log
			if a, ok := strings.CutPrefix(sc.Text(), "Listening for HTTP at address: "); ok {
				addr <- a
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-drained
		_ = cmd.Wait()
	})
	select {
	case a := <-addr:
		return "http://" + a
	case <-drained:
		t.Fatal("stripe-mock exited before it listened")
	case <-time.After(30 * time.Second):
		t.Fatal("stripe-mock did not say where it listens within 30s")
	}
	return ""
}

// TestCheckAgainstStripeMock runs idem check's engine against stripe-mock,
// which validates requests against Stripe's OpenAPI spec but keeps no
// state: every request with a key is performed anew (a new charge id), so
// the replay scenario must fail. This is what the tool tells a user about
// a server that accepts Idempotency-Key without honouring it.
func TestCheckAgainstStripeMock(t *testing.T) {
	base := startStripeMock(t)
	rep, err := idemtest.Check(context.Background(), idemtest.CheckConfig{
		URL: base + "/v1/charges",
		Header: http.Header{
			"Authorization": {"Bearer sk_test_123"},
			"Content-Type":  {"application/x-www-form-urlencoded"},
		},
		Body:      "amount=4200&currency=eur&source=tok_visa&description=order-{{uuid}}",
		KeyHeader: idem.Stripe.Header,
	})
	require.NoError(t, err)
	verdicts := map[string]idemtest.Verdict{}
	for _, r := range rep.Results {
		t.Logf("%-15s %-7s %s | %s | %s", r.Scenario, r.Verdict, r.Sent, r.Got, r.Why)
		verdicts[r.Scenario] = r.Verdict
	}
	assert.Equal(t, idemtest.Fail, verdicts[idemtest.ScenarioReplay], "stripe-mock keeps no state: a replay is a new charge")
	assert.False(t, rep.Conforms)
	assert.LessOrEqual(t, rep.Requests, idemtest.MaxCheckRequests)
}
