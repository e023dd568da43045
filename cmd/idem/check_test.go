package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemserver"
	"github.com/idemgo/idem/idemtest"
)

// charges is a handler that charges a card after a short pause: every run
// is a new charge id, so a replay is told from a second run.
type charges struct{ n atomic.Int64 }

func (c *charges) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	time.Sleep(20 * time.Millisecond)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":"ch_%d","request":%q}`, c.n.Add(1), b)
}

// otherPayload200 honours keys, but answers another payload under a used
// key with the first answer and 200.
type otherPayload200 struct {
	mu   sync.Mutex
	keys map[string][]byte
	ch   charges
}

func (s *otherPayload200) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	k := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.keys[k]; ok {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Idempotent-Replayed", "true")
		w.Write(b)
		return
	}
	rec := httptest.NewRecorder()
	s.ch.ServeHTTP(rec, r)
	s.keys[k] = rec.Body.Bytes()
	w.Write(rec.Body.Bytes())
}

// buildIdem builds the idem command into dir.
func buildIdem(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "idem")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// runBin runs the built command and returns its exit status and output.
func runBin(t *testing.T, bin string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	t.Logf("idem %v → exit %d\n%s%s", args, code, stdout.String(), stderr.String())
	return code, stdout.String(), stderr.String()
}

// TestCheckCommand drives the real idem binary against servers that honour
// keys and servers that do not.
func TestCheckCommand(t *testing.T) {
	bin := buildIdem(t, t.TempDir())
	body := `{"amount":4200,"currency":"eur","order":"{{uuid}}"}`

	ref := idemtest.NewServer(&charges{})
	defer ref.Close()
	mw := idemserver.New(idemserver.NewMemoryStore(), idemserver.WithSingleTenant())
	srv := httptest.NewServer(mw.Required(&charges{}))
	defer srv.Close()
	keyless := httptest.NewServer(&charges{})
	defer keyless.Close()
	lenient := httptest.NewServer(&otherPayload200{keys: make(map[string][]byte)})
	defer lenient.Close()
	forgetful := idemtest.NewServer(&charges{}, idemtest.WithRetention(time.Second), idemtest.WithRetryAfter(0))
	defer forgetful.Close()

	for _, tc := range []struct {
		name   string
		url    string
		extra  []string
		code   int
		failed []string
	}{
		{"idemtest", ref.URL + "/v1/charges", nil, 0, nil},
		{"idemserver", srv.URL + "/v1/charges", nil, 0, nil},
		{"performs every request", keyless.URL + "/v1/charges", nil, 1, []string{"replay", "other-payload", "concurrent", "cut-connection"}},
		{"another payload gets 200", lenient.URL + "/v1/charges", nil, 1, []string{"other-payload"}},
		{"forgets keys after a second", forgetful.URL + "/v1/charges", []string{"--wait-retention", "2s"}, 1, []string{"retention"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"check", "-H", "Content-Type: application/json", "-d", body}, tc.extra...)
			code, out, _ := runBin(t, bin, append(args, tc.url)...)
			assert.Equal(t, tc.code, code)
			assert.Contains(t, out, "SCENARIO")
			if tc.failed == nil {
				assert.Contains(t, out, ": conforms;")
				return
			}
			for _, f := range tc.failed {
				assert.Regexp(t, `(?m)^`+f+` .*fail`, out, "scenario %s named as failed", f)
			}
			assert.Contains(t, out, "does NOT conform (failed: ")

			// The same run as JSON says the same.
			code, out, _ = runBin(t, bin, append(append(args, "--json"), tc.url)...)
			assert.Equal(t, tc.code, code)
			var rep idemtest.CheckReport
			require.NoError(t, json.Unmarshal([]byte(out), &rep))
			assert.False(t, rep.Conforms)
			assert.Subset(t, rep.Failed(), tc.failed)
		})
	}

	t.Run("provider", func(t *testing.T) {
		var (
			mu   sync.Mutex
			keys []string
		)
		inner := idemtest.NewServer(&charges{}, idemtest.WithKeyHeader(idem.AmazonPay.Header))
		defer inner.Close()
		rec := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			keys = append(keys, r.Header.Get(idem.AmazonPay.Header))
			mu.Unlock()
			httputil.NewSingleHostReverseProxy(mustURL(t, inner.URL)).ServeHTTP(w, r)
		}))
		defer rec.Close()
		code, _, _ := runBin(t, bin, "check", "--provider", "amazonpay", "-d", body, rec.URL+"/v2/charges")
		assert.Equal(t, 0, code)
		rec.Close()
		mu.Lock()
		defer mu.Unlock()
		require.NotEmpty(t, keys)
		for _, k := range keys {
			assert.NoError(t, idem.AmazonPay.CheckKey(k))
			assert.Regexp(t, `^[0-9a-f]{32}$`, k)
		}
	})

	t.Run("usage", func(t *testing.T) {
		code, out, _ := runBin(t, bin, "check", "--help")
		assert.Equal(t, 0, code)
		assert.Contains(t, out, fmt.Sprintf("at most %d requests", idemtest.MaxCheckRequests))
		for _, args := range [][]string{
			{"check", ref.URL},                              // no body
			{"check", "-d", "{}"},                           // no URL
			{"check", "-d", "{}", ref.URL, ref.URL},         // two URLs
			{"check", "-d", "{}", "-H", "NoColon", ref.URL}, // bad header
			{"check", "-d", "{}", "--provider", "acme", ref.URL},
			{"check", "-d", "{}", "ftp://127.0.0.1/x"},
		} {
			code, _, _ := runBin(t, bin, args...)
			assert.Equal(t, 2, code, "%v", args)
		}
	})

	t.Run("refuses what does not look like a sandbox", func(t *testing.T) {
		var hits atomic.Int32
		live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
		defer live.Close()
		// A public name that resolves nowhere: refused before any lookup.
		code, _, errOut := runBin(t, bin, "check", "-d", "{}", "https://api.payments.example/v1/charges")
		assert.Equal(t, 2, code)
		assert.Contains(t, errOut, "--i-know-this-is-live")
		// The flag lifts the refusal, and the check runs (here against a
		// loopback server that answers every request with an empty 200).
		code, _, _ = runBin(t, bin, "check", "--i-know-this-is-live", "-d", "{}", live.URL)
		assert.Equal(t, 1, code, "runs, and a server that answers nothing useful does not conform")
		assert.NotZero(t, hits.Load())
	})
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	require.NoError(t, err)
	return u
}

func TestLooksLikeSandbox(t *testing.T) {
	for u, want := range map[string]bool{
		"http://127.0.0.1:8080/x":                    true,
		"http://[::1]/x":                             true,
		"http://10.1.2.3/x":                          true,
		"http://192.168.0.9/x":                       true,
		"http://localhost:12111/v1/charges":          true,
		"https://api.sandbox.paypal.com/v2/orders":   true,
		"https://checkout-test.adyen.com/v71":        true,
		"https://api-m.sandbox.paypal.com/":          true,
		"https://api.stripe.com/v1/charges":          false,
		"https://api.checkout.com/payments":          false,
		"https://8.8.8.8/x":                          false,
		"https://payment.direct.worldline-solutions": false,
		"https://connect.squareupsandbox.com/v2":     true,
		"https://pal-test.adyen.com/pal":             true,
		// A "test" or "sandbox" part is anyone's to register (issue 35, 8).
		"https://api.testing.example.com/":         false,
		"https://test.api.example.com/":            false,
		"https://test.evil-live-payments.com/":     false,
		"https://sandbox.evil-live-payments.com/":  false,
		"https://api.sandbox.paypal.com.evil.com/": false,
		"https://evilsandbox.com/":                 false,
		"https://x.api.sandbox.checkout.com/":      true,
		"https://pay-api.amazon.com/sandbox/v2/x":  true,
		"https://pay-api.amazon.com/live/v2/x":     false,
		"http://[fd12:3456::1]/x":                  true,
		// Link-local and metadata addresses are never a sandbox.
		"http://169.254.169.254/latest/meta-data/": false,
		"http://[fe80::1]/x":                       false,
		"http://[fd00:ec2::254]/x":                 false,
		"http://100.100.100.200/x":                 false,
		"http://metadata.google.internal/x":        false,
		"http://[::ffff:169.254.169.254]/x":        false,
		// "test" inside a word is no sign of a sandbox: these hosts are
		// live, and the check charges up to 32 times.
		"https://api.latestpay.com/v1/charges":  false,
		"https://pay.fastest-checkout.io/":      false,
		"https://api.greatestbank.com/payments": false,
		"https://attestation.example.com/":      false,
	} {
		p, err := url.Parse(u)
		require.NoError(t, err)
		assert.Equal(t, want, looksLikeSandbox(p), u)
	}
}

func TestBodyType(t *testing.T) {
	assert.Equal(t, "application/json", bodyType(` {"amount":1}`))
	assert.Equal(t, "application/json", bodyType(`[1]`))
	assert.Equal(t, "application/x-www-form-urlencoded", bodyType(`amount=1&currency=eur`))
}

// TestCheckRefusesUnsendableHeaders: a -H that net/http cannot send (a
// control byte in the value, a name that is not a token) is a usage
// error; it ran every scenario, each refused locally, and reported them
// "unknown" with "13 requests sent" when none was.
func TestCheckRefusesUnsendableHeaders(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer srv.Close()
	for _, h := range []string{"X-A: a\x01b", "X-A: a\x7f", "X A: v", "X-(A): v"} {
		var out, errOut bytes.Buffer
		code := checkCmd(t.Context(), []string{"-H", h, "-d", "x", srv.URL + "/v1/charges"}, &out, &errOut)
		assert.Equal(t, exitUsage, code, "%q: %s", h, errOut.String())
		assert.Contains(t, errOut.String(), "-H", "%q", h)
	}
	assert.Zero(t, hits.Load(), "nothing sent")
}

// TestCheckNeverSendsToMetadata is finding 8 of issue 35: link-local and
// metadata addresses and names are refused with --i-know-this-is-live
// too, and the check's client refuses to connect to one whatever a name
// resolved to.
func TestCheckNeverSendsToMetadata(t *testing.T) {
	for _, u := range []string{"http://169.254.169.254/latest/meta-data/", "http://[fe80::1]/", "http://metadata.google.internal/computeMetadata/v1/", "http://[fd00:ec2::254]/"} {
		r := runIdem(t, "check", "--i-know-this-is-live", "-d", "{}", u)
		assert.Equal(t, exitUsage, r.code, u)
		assert.Contains(t, r.stderr, "never sends there", u)
	}
	_, err := checkClient().Get("http://169.254.169.254:9/latest/meta-data/")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "does not connect to 169.254.169.254:9")
}
