package idemotel_test

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/semconv/v1.40.0/httpconv"
	"go.opentelemetry.io/otel/trace"

	idemotel "github.com/idemgo/idem/otel"
)

// TestRetriedOperationFollowsConventions checks one retried operation (a
// 503, then a 201) against the HTTP client semantic conventions of the
// version the module pins: span names, kinds and attributes; the duration
// histogram's name, unit, bucket boundaries and attributes; the
// instrumentation scope; and the names and units of idem's own metrics.
func TestRetriedOperationFollowsConventions(t *testing.T) {
	p := newProvider(t)
	r := newRig(t)
	require.NoError(t, r.post(t, context.Background(), p.URL+"/flaky", "pay:conv"))
	port := int64(p.Listener.Addr().(*net.TCPAddr).Port)

	spans := r.spans.Ended()
	require.Len(t, spans, 2)
	for i, s := range spans {
		assert.Equal(t, idemotel.ScopeName, s.InstrumentationScope().Name)
		assert.NotEmpty(t, s.InstrumentationScope().Version, "scope version")
		assert.Equal(t, semconv.SchemaURL, s.InstrumentationScope().SchemaURL)
		assert.Equal(t, "POST", s.Name(), "span name is the method")
		assert.Equal(t, trace.SpanKindClient, s.SpanKind())
		a := attrs(s.Attributes())
		// Required attributes of an HTTP client span.
		assert.Equal(t, "POST", a[semconv.HTTPRequestMethodKey].AsString())
		assert.Equal(t, "127.0.0.1", a[semconv.ServerAddressKey].AsString())
		assert.Equal(t, port, a[semconv.ServerPortKey].AsInt64())
		assert.Equal(t, p.URL+"/flaky?ref=abc", a[semconv.URLFullKey].AsString())
		assert.Equal(t, "1.1", a[semconv.NetworkProtocolVersionKey].AsString())
		if i == 0 {
			assert.Equal(t, int64(503), a[semconv.HTTPResponseStatusCodeKey].AsInt64())
			assert.Equal(t, "503", a[semconv.ErrorTypeKey].AsString())
			assert.NotContains(t, a, semconv.HTTPRequestResendCountKey, "set only on resends")
		} else {
			assert.Equal(t, int64(201), a[semconv.HTTPResponseStatusCodeKey].AsInt64())
			assert.NotContains(t, a, semconv.ErrorTypeKey)
			assert.Equal(t, int64(1), a[semconv.HTTPRequestResendCountKey].AsInt64())
		}
	}

	var rm metricdata.ResourceMetrics
	require.NoError(t, r.reader.Collect(context.Background(), &rm))
	var sm *metricdata.ScopeMetrics
	for i := range rm.ScopeMetrics {
		if rm.ScopeMetrics[i].Scope.Name == idemotel.ScopeName {
			sm = &rm.ScopeMetrics[i]
		}
	}
	require.NotNil(t, sm)
	assert.NotEmpty(t, sm.Scope.Version)
	assert.Equal(t, semconv.SchemaURL, sm.Scope.SchemaURL)
	byName := map[string]metricdata.Metrics{}
	for _, m := range sm.Metrics {
		byName[m.Name] = m
	}

	conv := httpconv.ClientRequestDuration{}
	d, ok := byName[conv.Name()]
	require.True(t, ok, "%s recorded", conv.Name())
	assert.Equal(t, conv.Unit(), d.Unit)
	assert.Equal(t, conv.Description(), d.Description)
	hist, ok := d.Data.(metricdata.Histogram[float64])
	require.True(t, ok, "%T", d.Data)
	require.Len(t, hist.DataPoints, 2, "one series per outcome")
	statuses := map[int64]bool{}
	for _, dp := range hist.DataPoints {
		assert.Equal(t, []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}, dp.Bounds)
		assert.Equal(t, uint64(1), dp.Count)
		a := map[attribute.Key]attribute.Value{}
		for _, kv := range dp.Attributes.ToSlice() {
			a[kv.Key] = kv.Value
		}
		status := a[semconv.HTTPResponseStatusCodeKey].AsInt64()
		statuses[status] = true
		want := []attribute.Key{semconv.HTTPRequestMethodKey, semconv.ServerAddressKey, semconv.ServerPortKey,
			semconv.HTTPResponseStatusCodeKey, semconv.NetworkProtocolVersionKey}
		if status >= 400 {
			want = append(want, semconv.ErrorTypeKey)
		}
		var got []attribute.Key
		for k := range a {
			got = append(got, k)
		}
		assert.ElementsMatch(t, want, got, "attributes of the %d series: the conventions', none of high cardinality", status)
	}
	assert.Equal(t, map[int64]bool{503: true, 201: true}, statuses)

	units := map[string]string{
		idemotel.MetricAttempts: "{attempt}",
		idemotel.MetricRetries:  "{retry}",
		idemotel.MetricSettled:  "{operation}",
		idemotel.MetricPending:  "{operation}",
	}
	for name, unit := range units {
		m, ok := byName[name]
		if assert.True(t, ok, "%s recorded", name) {
			assert.Equal(t, unit, m.Unit, name)
		}
	}
	for name := range byName {
		if name != conv.Name() {
			assert.True(t, strings.HasPrefix(name, "idem."), "%s is in the idem namespace", name)
		}
	}
}
