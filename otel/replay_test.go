package idemotel_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/replaytest"
	idemotel "github.com/idemgo/idem/otel"
)

// TestSpanPerRequestWritten sends keyed POSTs one after another to a server
// that drops every reused connection after reading its request, so
// net/http silently writes each request after the first twice. The spans,
// the attempts counter and the server's request count must agree, and
// http.request.resend_count must number the resends as the wire saw them.
func TestSpanPerRequestWritten(t *testing.T) {
	srv, err := replaytest.New()
	require.NoError(t, err)
	defer srv.Close()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) }()
	in, err := idemotel.New(nil, idemotel.WithTracerProvider(tp), idemotel.WithMeterProvider(mp))
	require.NoError(t, err)
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	c := idem.New(idem.NewMemoryStore(), idem.WithBaseTransport(base), idem.WithMaxAttempts(1), idem.WithHooks(in.Hooks()))
	defer c.Close()

	const calls = 3
	for i := range calls {
		ctx := idem.WithOperation(context.Background(), "pay:"+string(rune('a'+i)))
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/pay", strings.NewReader(`{}`))
		require.NoError(t, err)
		resp, err := c.HTTPClient().Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
	}
	require.Equal(t, 2*calls-1, srv.Requests(), "the server's request count (the test's premise)")

	ended := spans.Ended()
	assert.Len(t, ended, srv.Requests(), "spans")
	resends := map[string][]int64{}
	for _, s := range ended {
		a := attrs(s.Attributes())
		resends[a["idem.operation"].AsString()] = append(resends[a["idem.operation"].AsString()], a["http.request.resend_count"].AsInt64())
	}
	assert.Equal(t, map[string][]int64{"pay:a": {0}, "pay:b": {0, 1}, "pay:c": {0, 1}}, resends, "http.request.resend_count by operation")

	m := collect(t, reader)
	var counted, histogram int64
	if d, ok := m[idemotel.MetricAttempts].Data.(metricdata.Sum[int64]); ok {
		for _, p := range d.DataPoints {
			counted += p.Value
		}
	}
	if d, ok := m["http.client.request.duration"].Data.(metricdata.Histogram[float64]); ok {
		for _, p := range d.DataPoints {
			histogram += int64(p.Count)
		}
	}
	assert.Equal(t, int64(srv.Requests()), counted, "%s", idemotel.MetricAttempts)
	assert.Equal(t, int64(srv.Requests()), histogram, "http.client.request.duration samples")
}
