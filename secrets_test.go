package idem_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// quotingRT fails its first request with a *url.Error that quotes the
// URL as sent, as a base transport built on an http.Client does, and
// answers 201 after that. It keeps the headers it was sent.
type quotingRT struct {
	mu   sync.Mutex
	sent []http.Header
}

func (q *quotingRT) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		io.Copy(io.Discard, req.Body)
		req.Body.Close()
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.sent = append(q.sent, req.Header.Clone())
	if len(q.sent) == 1 {
		return nil, &url.Error{Op: "Post", URL: req.URL.String(), Err: errors.New("connection reset by peer")}
	}
	return &http.Response{StatusCode: 201, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("{}")), Request: req}, nil
}

// secretRequest is a keyed request carrying each default secret header
// and SigV4 presign parameters, and the secrets it carries.
func secretRequest(t *testing.T) (*http.Request, []string) {
	secrets := []string{"sk-ant-Xk3TT", "apik-Pw12", "authtok-Qq77", "amztok-Zz55", "SIGv4-Hh31", "AKIDcred-Jj09", "rtok-Mm42", "amzqtok-Ll66"}
	req, err := http.NewRequest(http.MethodPost,
		"https://s3.example/bucket/obj?X-Amz-Signature="+secrets[4]+"&X-Amz-Credential="+secrets[5]+
			"&refresh_token="+secrets[6]+"&X-Amz-Security-Token="+secrets[7]+"&part=3",
		strings.NewReader(`{"amount":100}`))
	require.NoError(t, err)
	req.Header.Set("X-Api-Key", secrets[0])
	req.Header.Set("Api-Key", secrets[1])
	req.Header.Set("X-Auth-Token", secrets[2])
	req.Header.Set("X-Amz-Security-Token", secrets[3])
	return req, secrets
}

// TestDefaultSecretsNeverJournaled is finding 4 of issue 35: X-Api-Key and
// the other default secret headers, and SigV4's presign parameters, are in
// neither the bbolt file's bytes nor the journaled URL; the error a base
// transport returned, quoting the URL, is journaled, logged and returned
// with the URL redacted.
func TestDefaultSecretsNeverJournaled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "journal.db")
		rt := &quotingRT{}
		var logs bytes.Buffer
		c, err := idem.Open(path, idem.WithBaseTransport(rt), idem.WithMaxAttempts(1),
			idem.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
		require.NoError(t, err)
		defer c.Close()
		req, secrets := secretRequest(t)
		_, err = c.Transport().RoundTrip(req)
		require.Error(t, err)
		for _, s := range secrets[4:] {
			assert.NotContains(t, err.Error(), s, "the error text idem built holds a secret query parameter")
		}
		assert.Contains(t, err.Error(), "part=3", "the harmless query is kept")

		require.Contains(t, logs.String(), "left in doubt")
		for _, s := range secrets {
			assert.NotContains(t, logs.String(), s, "the log holds a secret")
		}

		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		require.True(t, bytes.Contains(raw, []byte("part=3")), "the pending record is in the file")
		for _, s := range secrets {
			assert.False(t, bytes.Contains(raw, []byte(s)), "the journal file holds %q", s)
		}
		ops, err := c.Pending(context.Background(), "", 10)
		require.NoError(t, err)
		require.Len(t, ops, 1)
		assert.True(t, ops[0].Redacted)
		rt.mu.Lock()
		assert.Equal(t, secrets[0], rt.sent[0].Get("X-Api-Key"), "the request itself went out with its credentials")
		rt.mu.Unlock()
	})
}

// TestRedactURLAndText: the exported redaction the command, the live page
// and the otel package use.
func TestRedactURLAndText(t *testing.T) {
	got := idem.RedactURL("https://u:p@h.example/p?X-Amz-Signature=abc&x-amz-credential=def&ok=1&Session=s#frag", "session")
	assert.Equal(t, "https://REDACTED:REDACTED@h.example/p?X-Amz-Signature=REDACTED&x-amz-credential=REDACTED&ok=1&Session=REDACTED", got)
	text := `Post "https://h.example/p?api_key=k1&ok=1": dial tcp: connection refused`
	assert.Equal(t, `Post "https://h.example/p?api_key=REDACTED&ok=1": dial tcp: connection refused`, idem.RedactText(text))
	assert.Equal(t, "no url here", idem.RedactText("no url here"))
	keep := `Post "https://h.example/p?ok=1&x=%zz#frag": EOF`
	assert.Equal(t, keep, idem.RedactText(keep), "a URL without secrets is left as it was")
	h := idem.RedactHeader(http.Header{"X-Api-Key": {"k"}, "Content-Type": {"application/json"}})
	assert.Equal(t, http.Header{"X-Api-Key": {"REDACTED"}, "Content-Type": {"application/json"}}, h)
	for _, name := range []string{"X-Api-Key", "Api-Key", "X-Auth-Token", "X-Amz-Security-Token", "Authorization", "Cookie"} {
		assert.Contains(t, idem.DefaultSecretHeaders(), name)
	}
	for _, name := range []string{"X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token", "access_token", "refresh_token"} {
		assert.Contains(t, idem.DefaultSecretQueryParams(), name)
	}
}
