package main

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// TestShowBodyHoldsNoSecrets is finding 4 of issue 35 for the command:
// show --body of an operation a Client sent with X-Api-Key and SigV4
// presign parameters shows neither, because the journal holds neither;
// and a journal an earlier release wrote with them (forged here) shows
// them as REDACTED.
func TestShowBodyHoldsNoSecrets(t *testing.T) {
	const apiKey, sig, cred = "sk-ant-api03-do-not-print", "f00dfeedsig", "AKIDdonotprint"
	t.Run("journaled by a client", func(t *testing.T) {
		p := newProvider(t)
		path := filepath.Join(t.TempDir(), "journal.db")
		c, err := idem.Open(path, idem.WithMaxAttempts(1), idem.WithBaseTransport(&http.Transport{DisableKeepAlives: true}))
		require.NoError(t, err)
		ctx := idem.WithOperation(context.Background(), "pay:key")
		req, err := http.NewRequestWithContext(ctx, http.MethodPost,
			p.URL+"/lost?X-Amz-Signature="+sig+"&X-Amz-Credential="+cred+"&part=1", strings.NewReader(`{"amount":1}`))
		require.NoError(t, err)
		req.Header.Set("X-Api-Key", apiKey)
		if resp, err := c.HTTPClient().Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		require.NoError(t, c.Close())
		for _, args := range [][]string{{"show", "--body", "pay:key"}, {"--json", "show", "--body", "pay:key"}} {
			r := runIdem(t, append([]string{"--journal", path}, args...)...)
			require.Equal(t, exitOK, r.code, r.stderr)
			assert.Contains(t, r.stdout, "part=1")
			for _, s := range []string{apiKey, sig, cred} {
				assert.NotContains(t, r.stdout, s, "idem %v", args)
			}
		}
	})
	t.Run("written by an earlier release", func(t *testing.T) {
		op := forgedOp("00000000-0000-7000-8000-000000000001", "pay:old",
			"https://s3.example/o?X-Amz-Signature="+sig+"&part=1", time.Now().Add(-time.Minute))
		op.Header.Set("X-Api-Key", apiKey)
		path := forge(t, idem.Policy{}, op)
		var v opView
		runJSON(t, &v, "--journal", path, "show", "--body", "pay:old")
		assert.Equal(t, "REDACTED", v.Header.Get("X-Api-Key"))
		assert.Equal(t, "https://s3.example/o?X-Amz-Signature=REDACTED&part=1", v.URL)
		r := runIdem(t, "--journal", path, "show", "--body", "pay:old")
		require.Equal(t, exitOK, r.code, r.stderr)
		assert.NotContains(t, r.stdout, apiKey)
		assert.NotContains(t, r.stdout, sig)
	})
}
