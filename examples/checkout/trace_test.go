package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemtest"
)

// TestTracerTakesTheFirstRetriedOrder drives orders through a real Client
// and a provider scripted to answer 503 to the first attempt of some.
func TestTracerTakesTheFirstRetriedOrder(t *testing.T) {
	p := idemtest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}), idemtest.WithRetryAfter(0), idemtest.WithScript(func(key string, attempt int) idemtest.Fault {
		if attempt == 1 && strings.HasPrefix(key, "flaky-") {
			return idemtest.Unavailable
		}
		return idemtest.NoFault
	}))
	defer p.Close()
	c := idem.New(idem.NewMemoryStore(), idem.WithBackoff(time.Millisecond, time.Millisecond))
	defer c.Close()

	tr := &tracer{}
	order := func(key string) *orderTrace {
		h, o := tr.hooks()
		ctx := idem.WithRequestHooks(idem.WithKey(context.Background(), key), h)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL+"/v1/charges", strings.NewReader(`{"order":1}`))
		require.NoError(t, err)
		resp, err := c.HTTPClient().Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return o
	}

	assert.Nil(t, tr.take(order("calm-1")), "an order without a retry is not traced")
	lines := tr.take(order("flaky-1"))
	require.Len(t, lines, 4, "%q", lines)
	assert.Contains(t, lines[0], "attempt 1")
	assert.Contains(t, lines[0], "key flaky-1")
	assert.Contains(t, lines[0], "-> 503")
	assert.Contains(t, lines[1], "retry")
	assert.Contains(t, lines[1], "because 503")
	assert.Contains(t, lines[2], "attempt 2")
	assert.Contains(t, lines[2], "key flaky-1")
	assert.Contains(t, lines[2], "-> 201")
	assert.Contains(t, lines[3], "settled")
	assert.Contains(t, lines[3], "succeeded after 2 attempts")
	assert.Nil(t, tr.take(order("flaky-2")), "one order is traced")
}

// TestCheckoutTrace runs the demo with -trace's setting.
func TestCheckoutTrace(t *testing.T) {
	t.Setenv(envTrace, "1")
	exe, err := os.Executable()
	require.NoError(t, err)
	var out bytes.Buffer
	_, err = run(&out, exe, t.TempDir())
	t.Log("\n" + out.String())
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(out.String(), "from idem's hooks:"), "one order's trace")
	assert.Contains(t, out.String(), "attempt 2")
	assert.Contains(t, out.String(), "retry")
	assert.Contains(t, out.String(), "settled")
}
