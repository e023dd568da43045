package idemotel_test

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
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgo/idem"
	idemotel "github.com/idemgo/idem/otel"
)

// TestResumedAttemptLinksTheOriginalTrace journals an operation under a
// parent span, leaves it in doubt (the provider cuts the connection), and
// resumes it from a new Client, with new instrumentation, on the same
// bbolt file, by an explicit Resume and in the background: the resumed
// request's span is a root span of its own trace with a link to the span
// the operation was first sent under.
func TestResumedAttemptLinksTheOriginalTrace(t *testing.T) {
	for _, background := range []bool{false, true} {
		name := "Resume"
		if background {
			name = "background resume"
		}
		t.Run(name, func(t *testing.T) { testResumeLink(t, background) })
	}
}

func testResumeLink(t *testing.T, background bool) {
	p := newProvider(t)
	path := filepath.Join(t.TempDir(), "journal.db")
	base := &http.Transport{DisableKeepAlives: true}
	defer base.CloseIdleConnections()
	newTracing := func() (*idemotel.Instrumentation, *tracetest.SpanRecorder, *sdktrace.TracerProvider) {
		spans := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		in, err := idemotel.New(nil, idemotel.WithTracerProvider(tp))
		require.NoError(t, err)
		t.Cleanup(func() { _ = in.Shutdown() })
		return in, spans, tp
	}

	// The first process: the call fails in doubt under the app's span.
	in1, spans1, tp1 := newTracing()
	c1, err := idem.Open(path, idem.WithHooks(in1.Hooks()), idem.WithMaxAttempts(1), idem.WithBaseTransport(base))
	require.NoError(t, err)
	ctx, parent := tp1.Tracer("app").Start(context.Background(), "checkout")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL+"/lost", strings.NewReader(`{"amount":1}`))
	require.NoError(t, err)
	_, err = c1.HTTPClient().Do(req)
	require.Error(t, err)
	parent.End()
	require.NoError(t, c1.Close())
	original := parent.SpanContext()
	first := spans1.Ended()
	require.Len(t, first, 2, "the attempt's span and the app's")
	assert.Equal(t, original.TraceID(), first[0].SpanContext().TraceID(), "the first attempt is in the app's trace")

	// The second process resumes it.
	p.healed.Store(true)
	in2, spans2, _ := newTracing()
	done := make(chan int, 1)
	deliver := func(op idem.Operation, resp *http.Response, err error) {
		status := 0
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			status = resp.StatusCode
		}
		done <- status
	}
	opts := []idem.Option{idem.WithHooks(in2.Hooks()), idem.WithBaseTransport(base)}
	if background {
		opts = append(opts, idem.WithBackgroundResume(time.Millisecond, deliver))
	}
	c2, err := idem.Open(path, opts...)
	require.NoError(t, err)
	defer c2.Close()
	if !background {
		require.NoError(t, c2.Resume(context.Background(), deliver))
	}
	select {
	case status := <-done:
		require.Equal(t, http.StatusCreated, status)
	case <-time.After(30 * time.Second): // a guard, not a measurement
		t.Fatal("the operation was not resumed")
	}
	require.NoError(t, c2.Close())
	got := spans2.Ended()
	require.Len(t, got, 1)
	span := got[0]
	assert.False(t, span.Parent().IsValid(), "a resumed attempt has no parent in this process")
	assert.NotEqual(t, original.TraceID(), span.SpanContext().TraceID())
	require.Len(t, span.Links(), 1, "the resumed attempt links the original trace")
	link := span.Links()[0].SpanContext
	assert.Equal(t, original.TraceID(), link.TraceID())
	assert.Equal(t, original.SpanID(), link.SpanID())
	assert.True(t, link.IsRemote())
	assert.Equal(t, trace.FlagsSampled, link.TraceFlags()&trace.FlagsSampled)
}

func TestTraceParent(t *testing.T) {
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	assert.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", idemotel.TraceParent(ctx))
	assert.True(t, idem.ValidTraceparent(idemotel.TraceParent(ctx)))
	assert.Empty(t, idemotel.TraceParent(context.Background()))
}

// A call's own retries are not resends: their spans carry no link, and
// the journal keeps the trace of the call that reserved the operation.
func TestRetriesInOneCallHaveNoLink(t *testing.T) {
	r, p := newRig(t), newProvider(t)
	ctx, parent := r.tp.Tracer("app").Start(context.Background(), "checkout")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL+"/flaky", strings.NewReader(`{}`))
	require.NoError(t, err)
	resp, err := r.client.HTTPClient().Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	parent.End()
	require.Len(t, r.spans.Ended(), 3, "two attempts and the app's span")
	for _, s := range r.spans.Ended() {
		assert.Empty(t, s.Links(), s.Name())
	}
	ops, err := r.store.Walk(context.Background(), "", 0)
	require.NoError(t, err)
	require.Len(t, ops, 1)
	assert.Equal(t, idemotel.TraceParent(ctx), ops[0].Trace)
}

func TestTraceParentAllocatesOnce(t *testing.T) {
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid}))
	if n := testing.AllocsPerRun(100, func() { _ = idemotel.TraceParent(ctx) }); n > 1 {
		t.Errorf("TraceParent: %v allocations, want 1", n)
	}
}
