package idem_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// landing is the server a redirect points to; it keeps what it got.
type landing struct {
	*httptest.Server
	mu   sync.Mutex
	got  []*http.Request // method, header and URL of each request
	keys []string
}

func newLanding(t *testing.T) *landing {
	l := &landing{}
	l.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if to := r.URL.Query().Get("to"); to != "" {
			status, _ := strconv.Atoi(r.URL.Query().Get("status"))
			http.Redirect(w, r, to, status)
			return
		}
		l.mu.Lock()
		l.got = append(l.got, &http.Request{Method: r.Method, Header: r.Header.Clone(), URL: r.URL})
		l.keys = append(l.keys, r.Header.Get("Idempotency-Key"))
		l.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(l.Close)
	return l
}

// redirect returns a URL of l that answers status with a Location at to.
func (l *landing) redirect(status int, to string) string {
	return l.URL + "/pay?" + url.Values{"to": {to}, "status": {strconv.Itoa(status)}}.Encode()
}

// otherHost returns u with the host 127.0.0.1 named localhost: the same
// server, another host name, as a redirect to another host is.
func otherHost(t *testing.T, u string) string {
	t.Helper()
	host, port, err := net.SplitHostPort(strings.TrimPrefix(u, "http://"))
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1", host)
	return "http://localhost:" + port
}

// TestRedirectToAnotherHostStripsSecrets is finding 5 of issue 35: a 302
// after a keyed POST is followed as a GET to another host, and that GET
// must carry none of the secret headers (net/http strips Authorization and
// Cookie, not X-Api-Key); a redirect to the same host keeps them.
func TestRedirectToAnotherHostStripsSecrets(t *testing.T) {
	land := newLanding(t)
	for name, target := range map[string]string{"other host": otherHost(t, land.URL), "same host": land.URL} {
		t.Run(name, func(t *testing.T) {
			land.mu.Lock()
			land.got = nil
			land.mu.Unlock()
			from := land.redirect(http.StatusFound, target+"/landed")
			c, err := idem.Open(filepath.Join(t.TempDir(), "j.db"))
			require.NoError(t, err)
			defer c.Close()
			for _, hc := range []*http.Client{c.HTTPClient(), {Transport: c.Transport()}} {
				req, err := http.NewRequest(http.MethodPost, from, strings.NewReader(`{"amount":1}`))
				require.NoError(t, err)
				req.Header.Set("X-Api-Key", "sk-redirect-secret")
				req.Header.Set("X-Auth-Token", "tok-redirect-secret")
				req.Header.Set("X-Trace", "kept")
				resp, err := hc.Do(req)
				require.NoError(t, err)
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				require.Equal(t, http.StatusOK, resp.StatusCode)
			}
			land.mu.Lock()
			defer land.mu.Unlock()
			require.Len(t, land.got, 2)
			for _, r := range land.got {
				assert.Equal(t, http.MethodGet, r.Method)
				assert.Equal(t, "kept", r.Header.Get("X-Trace"))
				if name == "other host" {
					assert.Empty(t, r.Header.Get("X-Api-Key"), "X-Api-Key went to another host")
					assert.Empty(t, r.Header.Get("X-Auth-Token"), "X-Auth-Token went to another host")
				} else {
					assert.Equal(t, "sk-redirect-secret", r.Header.Get("X-Api-Key"), "the same host gets the request as sent")
				}
			}
		})
	}
}

// TestRedirectWithBodyIsNotASecondKey is finding 5 of issue 35: a 307 to
// another host, followed by a plain http.Client over the Client's
// Transport, must not re-send the payload under a new key; it is refused
// with ErrRedirected, and the journal holds one operation. HTTPClient
// returns the 307 itself.
func TestRedirectWithBodyIsNotASecondKey(t *testing.T) {
	for _, status := range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			land := newLanding(t)
			from := land.redirect(status, otherHost(t, land.URL)+"/landed")
			path := filepath.Join(t.TempDir(), "j.db")
			c, err := idem.Open(path)
			require.NoError(t, err)
			send := func(hc *http.Client) (*http.Response, error) {
				req, err := http.NewRequest(http.MethodPost, from+"&api_key=sk-in-query", strings.NewReader(`{"amount":1}`))
				require.NoError(t, err)
				req.Header.Set("X-Api-Key", "sk-redirect-secret")
				return hc.Do(req)
			}
			_, err = send(&http.Client{Transport: c.Transport()})
			require.Error(t, err)
			assert.True(t, errors.Is(err, idem.ErrRedirected), "err = %v", err)
			assert.NotContains(t, err.Error(), "sk-in-query", "the error idem built shows the URL redacted")

			resp, err := send(c.HTTPClient())
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, status, resp.StatusCode, "HTTPClient hands the redirect to the caller")

			land.mu.Lock()
			assert.Empty(t, land.got, "the payload went to the redirect's target")
			land.mu.Unlock()
			require.NoError(t, c.Close())
			s, err := idem.OpenBoltStore(path, nil)
			require.NoError(t, err)
			defer s.Close()
			ops, err := s.Walk(context.Background(), "", 100)
			require.NoError(t, err)
			assert.Len(t, ops, 2, "one operation per call, none for the redirect")
		})
	}
}
