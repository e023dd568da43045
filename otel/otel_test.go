package idemotel_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"go.uber.org/goleak"

	"github.com/idemgo/idem"
	idemotel "github.com/idemgo/idem/otel"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// provider answers /flaky with 503 on the first request of each key and
// 201 after, and cuts the connection on /lost until healed is set.
type provider struct {
	*httptest.Server
	healed atomic.Bool
}

func newProvider(t *testing.T) *provider {
	t.Helper()
	p := &provider{}
	var mu sync.Mutex
	seen := map[string]int{}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		seen[r.Header.Get(idem.DefaultHeader)]++
		n := seen[r.Header.Get(idem.DefaultHeader)]
		mu.Unlock()
		switch {
		case r.URL.Path == "/flaky" && n == 1:
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		case r.URL.Path == "/lost" && !p.healed.Load():
			panic(http.ErrAbortHandler)
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(p.Close)
	return p
}

// rig is a Client wired to an Instrumentation with in-memory exporters.
type rig struct {
	client *idem.Client
	store  *idem.MemoryStore
	in     *idemotel.Instrumentation
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
}

func newRig(t *testing.T, opts ...idemotel.Option) *rig {
	t.Helper()
	r := &rig{store: idem.NewMemoryStore(), spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	r.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	var err error
	r.in, err = idemotel.New(r.store, append([]idemotel.Option{idemotel.WithTracerProvider(r.tp), idemotel.WithMeterProvider(mp)}, opts...)...)
	require.NoError(t, err)
	r.client = idem.New(r.store,
		idem.WithHooks(r.in.Hooks()),
		idem.WithMaxAttempts(2),
		idem.WithBackoff(time.Millisecond, time.Millisecond),
		idem.WithBaseTransport(&http.Transport{DisableKeepAlives: true}))
	t.Cleanup(func() {
		_ = r.in.Shutdown()
		_ = r.client.Close()
		_ = mp.Shutdown(context.Background())
		_ = r.tp.Shutdown(context.Background())
	})
	return r
}

// post sends a named POST and reads the answer to the end.
func (r *rig) post(t *testing.T, ctx context.Context, url, name string) error {
	t.Helper()
	req, err := http.NewRequestWithContext(idem.WithOperation(ctx, name), http.MethodPost, url+"?ref=abc", strings.NewReader(`{}`))
	require.NoError(t, err)
	resp, err := r.client.HTTPClient().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.ReadAll(resp.Body)
	return err
}

// attrs returns a span's attributes by key.
func attrs(kvs []attribute.KeyValue) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

func TestSpanPerAttempt(t *testing.T) {
	p := newProvider(t)
	r := newRig(t)
	require.NoError(t, r.post(t, context.Background(), p.URL+"/flaky", "pay:1"))

	spans := r.spans.Ended()
	require.Len(t, spans, 2)
	for i, s := range spans {
		assert.Equal(t, "POST", s.Name())
		assert.Equal(t, trace.SpanKindClient, s.SpanKind())
		assert.True(t, s.StartTime().Before(s.EndTime()), "span %d starts when the attempt began", i)
		assert.False(t, s.Parent().IsValid(), "client-wide hooks have no context")
		a := attrs(s.Attributes())
		assert.Equal(t, "POST", a["http.request.method"].AsString())
		assert.Equal(t, p.URL+"/flaky?ref=abc", a["url.full"].AsString(), "query kept")
		assert.Equal(t, "127.0.0.1", a["server.address"].AsString())
		assert.Equal(t, "pay:1", a["idem.operation"].AsString())
		assert.NotEmpty(t, a["idem.key"].AsString())
	}
	first, second := attrs(spans[0].Attributes()), attrs(spans[1].Attributes())
	assert.Equal(t, int64(503), first["http.response.status_code"].AsInt64())
	assert.Equal(t, "503", first["error.type"].AsString())
	assert.NotContains(t, first, attribute.Key("http.request.resend_count"), "the first attempt is not a resend")
	assert.Equal(t, codes.Error, spans[0].Status().Code)

	assert.Equal(t, int64(201), second["http.response.status_code"].AsInt64())
	assert.Equal(t, int64(1), second["http.request.resend_count"].AsInt64())
	assert.NotContains(t, second, attribute.Key("error.type"))
	assert.Equal(t, codes.Unset, spans[1].Status().Code)
	assert.Equal(t, first["idem.key"], second["idem.key"], "one key for both attempts")
	assert.False(t, spans[1].StartTime().Before(spans[0].EndTime()), "the retry starts after the first attempt ended")
}

func TestErrorSpans(t *testing.T) {
	p := newProvider(t)
	r := newRig(t)
	require.Error(t, r.post(t, context.Background(), p.URL+"/lost", "pay:lost"))
	spans := r.spans.Ended()
	require.Len(t, spans, 2)
	for _, s := range spans {
		a := attrs(s.Attributes())
		assert.Equal(t, "connection_closed", a["error.type"].AsString())
		assert.NotContains(t, a, attribute.Key("http.response.status_code"))
		assert.Equal(t, codes.Error, s.Status().Code)
	}
}

func TestRequestHooksParentSpans(t *testing.T) {
	p := newProvider(t)
	r := newRig(t, idemotel.WithoutClientSpans())
	ctx, parent := r.tp.Tracer("test").Start(context.Background(), "checkout")
	ctx = idem.WithRequestHooks(ctx, r.in.RequestHooks(ctx))
	require.NoError(t, r.post(t, ctx, p.URL+"/flaky", "pay:2"))
	parent.End()

	var attempts []sdktrace.ReadOnlySpan
	for _, s := range r.spans.Ended() {
		if s.Name() == "POST" {
			attempts = append(attempts, s)
		}
	}
	require.Len(t, attempts, 2, "one span per attempt, none from the client-wide hooks")
	for _, s := range attempts {
		assert.Equal(t, parent.SpanContext().SpanID(), s.Parent().SpanID())
		assert.Equal(t, parent.SpanContext().TraceID(), s.SpanContext().TraceID())
	}
}

func TestClientSpansJoinTheRequestsTrace(t *testing.T) {
	p := newProvider(t)
	r := newRig(t)
	ctx, parent := r.tp.Tracer("test").Start(context.Background(), "checkout")
	require.NoError(t, r.post(t, ctx, p.URL+"/flaky", "pay:3"))
	parent.End()

	var attempts []sdktrace.ReadOnlySpan
	for _, s := range r.spans.Ended() {
		if s.Name() == "POST" {
			attempts = append(attempts, s)
		}
	}
	require.Len(t, attempts, 2)
	for _, s := range attempts {
		assert.Equal(t, parent.SpanContext().SpanID(), s.Parent().SpanID(), "the client-wide hooks parent spans to the request's span")
	}
}

// metrics collects r's metrics by name.
func (r *rig) metrics(t *testing.T) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.reader.Collect(context.Background(), &rm))
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != idemotel.ScopeName {
			continue
		}
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// sums returns a counter's points by the value of key ("" for all).
func sums(t *testing.T, data metricdata.Aggregation, key attribute.Key) map[string]int64 {
	t.Helper()
	s, ok := data.(metricdata.Sum[int64])
	require.True(t, ok, "%T", data)
	out := map[string]int64{}
	for _, dp := range s.DataPoints {
		v, _ := dp.Attributes.Value(key)
		out[v.String()] += dp.Value
	}
	return out
}

func TestMetrics(t *testing.T) {
	p := newProvider(t)
	r := newRig(t)
	ctx := context.Background()
	require.NoError(t, r.post(t, ctx, p.URL+"/flaky", "pay:1"))
	require.Error(t, r.post(t, ctx, p.URL+"/lost", "pay:lost"))

	m := r.metrics(t)
	assert.Equal(t, map[string]int64{"503": 1, "201": 1, "connection closed": 2}, sums(t, m["idem.attempts"], "idem.reason"))
	assert.Equal(t, map[string]int64{"503": 1, "connection closed": 1}, sums(t, m["idem.retries"], "idem.reason"))
	assert.Equal(t, map[string]int64{"succeeded": 1}, sums(t, m[idemotel.MetricSettled], "idem.state"))
	assert.Equal(t, map[string]int64{"": 1}, sums(t, m[idemotel.MetricLeftInDoubt], ""))
	assert.NotContains(t, m, idemotel.MetricResumed, "nothing resumed yet")

	hist, ok := m["http.client.request.duration"].(metricdata.Histogram[float64])
	require.True(t, ok)
	var n uint64
	for _, dp := range hist.DataPoints {
		n += dp.Count
	}
	assert.Equal(t, uint64(4), n, "one duration per attempt")

	pending, ok := m["idem.operation.pending"].(metricdata.Gauge[int64])
	require.True(t, ok, "%T", m["idem.operation.pending"])
	byLease := map[string]int64{}
	for _, dp := range pending.DataPoints {
		v, _ := dp.Attributes.Value("idem.lease")
		byLease[v.AsString()] = dp.Value
	}
	assert.Equal(t, map[string]int64{"live": 0, "lapsed": 1}, byLease)
	age, ok := m["idem.operation.in_doubt.oldest_age"].(metricdata.Gauge[float64])
	require.True(t, ok)
	require.Len(t, age.DataPoints, 1)
	assert.Greater(t, age.DataPoints[0].Value, 0.0)

	// Resume finishes the operation in doubt: the gauges drop to zero.
	p.healed.Store(true)
	require.NoError(t, r.client.Resume(ctx, func(_ idem.Operation, resp *http.Response, err error) {
		require.NoError(t, err)
		resp.Body.Close()
	}))
	m = r.metrics(t)
	assert.Equal(t, map[string]int64{"": 1}, sums(t, m[idemotel.MetricResumed], ""))
	pending = m["idem.operation.pending"].(metricdata.Gauge[int64])
	for _, dp := range pending.DataPoints {
		assert.Zero(t, dp.Value)
	}
	age = m["idem.operation.in_doubt.oldest_age"].(metricdata.Gauge[float64])
	require.Len(t, age.DataPoints, 1)
	assert.Zero(t, age.DataPoints[0].Value)

	// After Shutdown the journal is no longer read.
	require.NoError(t, r.in.Shutdown())
	m = r.metrics(t)
	assert.NotContains(t, m, "idem.operation.pending")
}

func TestNoJournalNoGauges(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	in, err := idemotel.New(nil, idemotel.WithMeterProvider(mp), idemotel.WithTracerProvider(noop.NewTracerProvider()))
	require.NoError(t, err)
	require.NoError(t, in.Shutdown())
	assert.NotContains(t, collect(t, reader), "idem.operation.pending")
}
