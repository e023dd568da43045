package idem_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// onlyRecord returns the one record of store.
func onlyRecord(t *testing.T, store *idem.MemoryStore) idem.Operation {
	t.Helper()
	ops, err := store.Walk(t.Context(), "", 0)
	require.NoError(t, err)
	require.Len(t, ops, 1)
	return ops[0]
}

// scripted answers each request with the next step: a status, or an
// error when status is 0.
func scripted(steps ...int) http.RoundTripper {
	n := 0
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Body != nil {
			_, _ = io.Copy(io.Discard, r.Body)
		}
		code := steps[min(n, len(steps)-1)]
		n++
		if code == 0 {
			return nil, io.ErrUnexpectedEOF
		}
		return &http.Response{StatusCode: code, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("{}")), Request: r}, nil
	})
}

func TestHistoryJournalsEachRetriedAttempt(t *testing.T) {
	t.Run("retries then a success keep their history", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c, store := newTestClient(scripted(503, 0, 201), idem.WithMaxAttempts(3))
			resp, err := post(t, t.Context(), c.HTTPClient(), `{"a":1}`)
			require.NoError(t, err)
			_, _ = io.ReadAll(resp.Body)
			require.NoError(t, resp.Body.Close())
			rec := onlyRecord(t, store)
			require.Equal(t, idem.StateSucceeded, rec.State)
			require.Len(t, rec.History, 2)
			require.Equal(t, idem.Attempt{Sent: 1, Status: 503, Reason: "503", At: rec.History[0].At}, rec.History[0])
			require.Equal(t, 1, rec.History[1].Sent)
			require.Equal(t, 0, rec.History[1].Status)
			require.Equal(t, "connection closed", rec.History[1].Reason)
			require.Contains(t, rec.History[1].Err, "unexpected EOF")
			require.False(t, rec.History[1].At.Before(rec.History[0].At))
			require.Equal(t, 3, rec.Attempts)
		})
	})
	t.Run("a one-attempt success records none", func(t *testing.T) {
		c, store := newTestClient(scripted(201))
		resp, err := post(t, t.Context(), c.HTTPClient(), `{"a":1}`)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Empty(t, onlyRecord(t, store).History)
	})
	t.Run("an operation left in doubt records its last attempt", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c, store := newTestClient(scripted(503, 0), idem.WithMaxAttempts(2))
			_, err := post(t, t.Context(), c.HTTPClient(), `{"a":1}`)
			require.Error(t, err)
			rec := onlyRecord(t, store)
			require.Equal(t, idem.StatePending, rec.State)
			require.Len(t, rec.History, 2)
			require.Equal(t, "503", rec.History[0].Reason)
			require.Equal(t, "connection closed", rec.History[1].Reason)
		})
	})
}

type traceKey struct{}

func TestTraceContextJournaledAtReservation(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	fromCtx := func(ctx context.Context) string { s, _ := ctx.Value(traceKey{}).(string); return s }
	for _, tc := range []struct {
		name  string
		hooks []*idem.Hooks
		ctx   string
		want  string
	}{
		{"kept", []*idem.Hooks{{TraceContext: fromCtx}}, tp, tp},
		{"malformed, dropped", []*idem.Hooks{{TraceContext: fromCtx}}, "00-xyz", ""},
		{"none", []*idem.Hooks{{TraceContext: fromCtx}}, "", ""},
		{"the first well-formed wins", []*idem.Hooks{
			{TraceContext: func(context.Context) string { return "" }},
			{TraceContext: func(context.Context) string { return "garbage" }},
			{TraceContext: fromCtx},
			{TraceContext: func(context.Context) string { return "00-11111111111111111111111111111111-2222222222222222-01" }},
		}, tp, tp},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := []idem.Option{}
			for _, h := range tc.hooks {
				opts = append(opts, idem.WithHooks(h))
			}
			var got []string
			opts = append(opts, idem.WithHooks(&idem.Hooks{AttemptDone: func(a idem.AttemptInfo) { got = append(got, a.Trace) }}))
			c, store := newTestClient(scripted(201), opts...)
			ctx := context.WithValue(t.Context(), traceKey{}, tc.ctx)
			resp, err := post(t, ctx, c.HTTPClient(), `{"a":1}`)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			require.Equal(t, tc.want, onlyRecord(t, store).Trace)
			require.Equal(t, []string{tc.want}, got, "OperationInfo.Trace")
		})
	}
}

func TestValidTraceparent(t *testing.T) {
	for s, want := range map[string]bool{
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01":      true,
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00":      true,
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-abcd": true, // a later version may add fields
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-abcd": false,
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01":      false,
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01":      false,
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01":      false,
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01":      false,
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7":         false,
		"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01":      false,
		"": false,
	} {
		if got := idem.ValidTraceparent(s); got != want {
			t.Errorf("ValidTraceparent(%q) = %v, want %v", s, got, want)
		}
	}
}

func TestAppendHistoryBoundsAndShares(t *testing.T) {
	var h []idem.Attempt
	at := time.Unix(0, 0)
	for i := range idem.MaxHistory + 2 {
		prev := h
		h = idem.AppendHistory(h, idem.Attempt{Sent: i, At: at})
		if len(prev) > 0 && prev[len(prev)-1].Sent != i-1 {
			t.Fatal("AppendHistory changed the slice it was given")
		}
	}
	require.Len(t, h, idem.MaxHistory)
	require.Equal(t, 2, h[0].Sent)
	require.Equal(t, idem.MaxHistory+1, h[len(h)-1].Sent)
}
