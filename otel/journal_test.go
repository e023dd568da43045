package idemotel_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemgo/idem"
	idemotel "github.com/idemgo/idem/otel"
)

// failingReserve is a store whose reservations fail as on a full disk.
type failingReserve struct{ *idem.MemoryStore }

func (failingReserve) Reserve(context.Context, idem.Operation) (idem.Operation, bool, error) {
	return idem.Operation{}, false, fmt.Errorf("%w: no space left on device", idem.ErrJournalWrite)
}

// collect returns the metrics of reader by name.
func collect(t *testing.T, reader *sdkmetric.ManualReader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

func TestJournalHealth(t *testing.T) {
	p := newProvider(t)
	path := filepath.Join(t.TempDir(), "journal.db")
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
	defer tp.Shutdown(context.Background())
	in, err := idemotel.New(nil, idemotel.WithMeterProvider(mp), idemotel.WithTracerProvider(tp), idemotel.WithJournalFile(path))
	require.NoError(t, err)
	defer in.Shutdown()

	c, err := idem.Open(path, idem.WithHooks(in.Hooks()))
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, p.URL+"/ok", strings.NewReader(`{}`))
	require.NoError(t, err)
	resp, err := c.HTTPClient().Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.NoError(t, c.Close())

	m := collect(t, reader)
	commits, ok := m[idemotel.MetricCommitDuration].Data.(metricdata.Histogram[float64])
	require.True(t, ok, "%s recorded", idemotel.MetricCommitDuration)
	assert.Equal(t, "s", m[idemotel.MetricCommitDuration].Unit)
	require.NotEmpty(t, commits.DataPoints)
	assert.Equal(t, idemotel.CommitBuckets, commits.DataPoints[0].Bounds)
	assert.Positive(t, commits.DataPoints[0].Count)
	size, ok := m[idemotel.MetricJournalSize].Data.(metricdata.Gauge[int64])
	require.True(t, ok, "%s observed", idemotel.MetricJournalSize)
	assert.Equal(t, "By", m[idemotel.MetricJournalSize].Unit)
	assert.Positive(t, size.DataPoints[0].Value)

	// A reservation that fails is counted by write and error.type.
	fc := idem.New(failingReserve{idem.NewMemoryStore()}, idem.WithHooks(in.Hooks()))
	defer fc.Close()
	req, err = http.NewRequest(http.MethodPost, p.URL+"/ok", strings.NewReader(`{}`))
	require.NoError(t, err)
	_, err = fc.HTTPClient().Do(req)
	require.ErrorIs(t, err, idem.ErrJournalWrite)
	m = collect(t, reader)
	errs, ok := m[idemotel.MetricJournalErrors].Data.(metricdata.Sum[int64])
	require.True(t, ok, "%s recorded", idemotel.MetricJournalErrors)
	require.Len(t, errs.DataPoints, 1)
	write, _ := errs.DataPoints[0].Attributes.Value(idemotel.KeyWrite)
	kind, _ := errs.DataPoints[0].Attributes.Value("error.type")
	assert.Equal(t, idem.WriteReserve, write.AsString())
	assert.Equal(t, "journal_write", kind.AsString())
	assert.Equal(t, int64(1), errs.DataPoints[0].Value)
}

// TestCollectionAfterClose collects the gauges after the Client closed
// but before Shutdown, the order natural defers give: no error.
func TestCollectionAfterClose(t *testing.T) {
	store := idem.NewMemoryStore()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	in, err := idemotel.New(store, idemotel.WithMeterProvider(mp))
	require.NoError(t, err)
	defer in.Shutdown()
	c := idem.New(store, idem.WithHooks(in.Hooks()))
	require.NoError(t, c.Close())
	var rm metricdata.ResourceMetrics
	assert.NoError(t, reader.Collect(context.Background(), &rm))
}

func TestURLFullRedactsSecretValues(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())
	in, err := idemotel.New(nil, idemotel.WithTracerProvider(tp), idemotel.WithRedactedQueryParams("session"))
	require.NoError(t, err)
	raw := "https://api.test/v1/pay?ref=abc&Signature=s3cr3t&session=xyz&sig=1&X-Goog-Signature=zz&page=2"
	in.Hooks().AttemptDone(idem.AttemptInfo{OperationInfo: idem.OperationInfo{Method: "POST", URL: raw}, Attempt: 1, Status: 200})
	ended := spans.Ended()
	require.Len(t, ended, 1)
	got := attrs(ended[0].Attributes())["url.full"].AsString()
	u, err := url.Parse(got)
	require.NoError(t, err)
	assert.Equal(t, url.Values{"ref": {"abc"}, "Signature": {"REDACTED"}, "session": {"REDACTED"}, "sig": {"REDACTED"},
		"X-Goog-Signature": {"REDACTED"}, "page": {"2"}}, u.Query())
	assert.Equal(t, "https://api.test/v1/pay?ref=abc&Signature=REDACTED&session=REDACTED&sig=REDACTED&X-Goog-Signature=REDACTED&page=2", got, "order kept")
}

// TestURLFullRedactsSigV4 is finding 4 of issue 35: url.full redacts with
// idem's one list of secret parameters, which holds SigV4's presign
// parameters and the usual token names, whatever their case.
func TestURLFullRedactsSigV4(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())
	in, err := idemotel.New(nil, idemotel.WithTracerProvider(tp))
	require.NoError(t, err)
	raw := "https://s3.example/b/o?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDx&X-Amz-Signature=f00d&x-amz-security-token=tok&refresh_token=rt&part=1"
	in.Hooks().AttemptDone(idem.AttemptInfo{OperationInfo: idem.OperationInfo{Method: "PUT", URL: raw}, Attempt: 1, Status: 200})
	ended := spans.Ended()
	require.Len(t, ended, 1)
	got := attrs(ended[0].Attributes())["url.full"].AsString()
	assert.Equal(t, "https://s3.example/b/o?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=REDACTED&X-Amz-Signature=REDACTED&x-amz-security-token=REDACTED&refresh_token=REDACTED&part=1", got)

	// A failed attempt's status description is the error's text, whose
	// *url.Error quotes the URL as sent: redacted too.
	in.Hooks().AttemptDone(idem.AttemptInfo{OperationInfo: idem.OperationInfo{Method: "PUT", URL: raw}, Attempt: 2,
		Err: &url.Error{Op: "Put", URL: raw, Err: errors.New("connection reset by peer")}})
	ended = spans.Ended()
	require.Len(t, ended, 2)
	desc := ended[1].Status().Description
	assert.Contains(t, desc, "connection reset by peer")
	for _, secret := range []string{"AKIDx", "f00d", "=tok", "=rt"} {
		assert.NotContains(t, desc, secret)
	}
}
