// Package idemotel reports what idem does to OpenTelemetry: metrics for
// attempts, retries and operation outcomes, gauges for the pending
// operations and the age of the oldest one in doubt, and a client span per
// attempt with the HTTP semantic conventions' attributes.
//
// It is a module of its own (github.com/idemgo/idem/otel), so that idem's
// core does not depend on OpenTelemetry.
//
//	in, err := idemotel.New(store) // store: the Client's KeyStore, or nil
//	...
//	defer in.Shutdown()
//	client := idem.New(store, idem.WithHooks(in.Hooks()))
//
// idem calls its hooks after an attempt, so each span is created with the
// attempt's start time (now minus its latency) and ended at once, as a
// child of the span in the request's context (AttemptInfo.Context).
// RequestHooks(ctx) parents spans to ctx's span instead, for requests whose
// context carries none; build the Instrumentation WithoutClientSpans then,
// so each attempt has one span.
package idemotel

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgo/idem"
)

// ScopeName is the instrumentation scope of the tracer and meter.
const ScopeName = "github.com/idemgo/idem/otel"

// Attribute keys of idem's own, beside the semantic conventions'.
const (
	KeyKey       = attribute.Key("idem.key")
	KeyOperation = attribute.Key("idem.operation")
	KeyReason    = attribute.Key("idem.reason")
	KeyState     = attribute.Key("idem.state")
	KeySource    = attribute.Key("idem.retry.delay_source")
	KeyLease     = attribute.Key("idem.lease")
)

// Metric names of idem's own instruments, beside the semantic
// conventions' http.client.request.duration.
const (
	MetricAttempts = "idem.attempts"
)

// Journal is what the pending gauges read. Every idem.KeyStore is one.
type Journal interface {
	Pending(ctx context.Context, after string, limit int) ([]idem.Operation, error)
}

// Option configures an Instrumentation.
type Option func(*config)

type config struct {
	tp          trace.TracerProvider
	mp          metric.MeterProvider
	clientSpans bool
	now         func() time.Time
}

// WithTracerProvider sets where spans go. The default is the global
// provider (otel.GetTracerProvider).
func WithTracerProvider(tp trace.TracerProvider) Option { return func(c *config) { c.tp = tp } }

// WithMeterProvider sets where metrics go. The default is the global
// provider (otel.GetMeterProvider).
func WithMeterProvider(mp metric.MeterProvider) Option { return func(c *config) { c.mp = mp } }

// WithoutClientSpans makes Hooks record metrics only, for applications
// that make spans with RequestHooks.
func WithoutClientSpans() Option { return func(c *config) { c.clientSpans = false } }

// Instrumentation turns idem's hooks into spans and metrics. It is safe
// for concurrent use.
type Instrumentation struct {
	cfg    config
	tracer trace.Tracer
	reg    metric.Registration // the pending gauges' callback, or nil

	attempts   metric.Int64Counter
	duration   metric.Float64Histogram
	retries    metric.Int64Counter
	settled    metric.Int64Counter
	inDoubt    metric.Int64Counter
	resumed    metric.Int64Counter
	expired    metric.Int64Counter
	pending    metric.Int64ObservableGauge
	oldestAge  metric.Float64ObservableGauge
	shutdownMu sync.Mutex
}

// maxWalk caps how many pending operations one collection of the gauges
// reads.
const maxWalk = 100_000

// New returns an Instrumentation. If journal is not nil, the gauges
// idem.operation.pending and idem.operation.in_doubt.oldest_age read it at
// each collection.
func New(journal Journal, opts ...Option) (*Instrumentation, error) {
	cfg := config{clientSpans: true, now: time.Now}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if cfg.tp == nil {
		cfg.tp = otel.GetTracerProvider()
	}
	if cfg.mp == nil {
		cfg.mp = otel.GetMeterProvider()
	}
	in := &Instrumentation{cfg: cfg, tracer: cfg.tp.Tracer(ScopeName)}
	m := cfg.mp.Meter(ScopeName)
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	var err error
	in.attempts, err = m.Int64Counter(MetricAttempts, metric.WithUnit("{attempt}"),
		metric.WithDescription("Requests written under an idempotency key, by how idem classified their outcome."))
	add(err)
	in.duration, err = m.Float64Histogram("http.client.request.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of HTTP client requests (each attempt until its response headers or error)."))
	add(err)
	in.retries, err = m.Int64Counter("idem.retries", metric.WithUnit("{retry}"),
		metric.WithDescription("Retries scheduled, by the reason of the failed attempt."))
	add(err)
	in.settled, err = m.Int64Counter("idem.operations.settled", metric.WithUnit("{operation}"),
		metric.WithDescription("Operations whose caller received the answer, by final state."))
	add(err)
	in.inDoubt, err = m.Int64Counter("idem.operations.in_doubt", metric.WithUnit("{operation}"),
		metric.WithDescription("Operations left pending without an answer for the caller."))
	add(err)
	in.resumed, err = m.Int64Counter("idem.operations.resumed", metric.WithUnit("{operation}"),
		metric.WithDescription("Operations Resume sent again."))
	add(err)
	in.expired, err = m.Int64Counter("idem.operations.expired", metric.WithUnit("{operation}"),
		metric.WithDescription("Operations given up unsent past the resend window."))
	add(err)
	if journal != nil {
		in.pending, err = m.Int64ObservableGauge("idem.operation.pending", metric.WithUnit("{operation}"),
			metric.WithDescription("Operations pending in the journal, by lease: live (being sent) or lapsed (in doubt)."))
		add(err)
		in.oldestAge, err = m.Float64ObservableGauge("idem.operation.in_doubt.oldest_age", metric.WithUnit("s"),
			metric.WithDescription("Age of the oldest operation in doubt (pending under no live lease); 0 when none."))
		add(err)
		if err := errors.Join(errs...); err == nil {
			in.reg, err = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
				return in.observe(ctx, journal, o)
			}, in.pending, in.oldestAge)
			add(err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return in, nil
}

// Shutdown stops the gauges' reading of the journal. Call it before the
// journal is closed.
func (in *Instrumentation) Shutdown() error {
	in.shutdownMu.Lock()
	defer in.shutdownMu.Unlock()
	if in.reg == nil {
		return nil
	}
	err := in.reg.Unregister()
	in.reg = nil
	return err
}

// observe reads the journal's pending operations for the gauges.
func (in *Instrumentation) observe(ctx context.Context, j Journal, o metric.Observer) error {
	now := in.cfg.now()
	var (
		live, lapsed int64
		oldest       time.Time
		errs         []error
		seen         int
	)
	for after := ""; seen < maxWalk; {
		page, err := j.Pending(ctx, after, 500)
		if err != nil {
			errs = append(errs, err)
		}
		for _, op := range page {
			seen++
			if op.State == idem.StatePending && op.Owner != "" && op.LeaseUntil.After(now) {
				live++
				continue
			}
			lapsed++ // unreadable records count as in doubt: no one sends them
			if op.State == idem.StatePending && (oldest.IsZero() || op.Created.Before(oldest)) {
				oldest = op.Created
			}
		}
		if len(page) < 500 {
			break
		}
		after = page[len(page)-1].Key
	}
	if len(errs) > 0 && seen == 0 {
		return errors.Join(errs...) // nothing read: observe nothing rather than zeros
	}
	o.ObserveInt64(in.pending, live, metric.WithAttributes(KeyLease.String("live")))
	o.ObserveInt64(in.pending, lapsed, metric.WithAttributes(KeyLease.String("lapsed")))
	age := 0.0
	if !oldest.IsZero() {
		age = max(now.Sub(oldest), 0).Seconds()
	}
	o.ObserveFloat64(in.oldestAge, age)
	return errors.Join(errs...)
}

// Hooks returns the hooks that record metrics, and spans unless
// WithoutClientSpans was given. Give them to idem.WithHooks.
func (in *Instrumentation) Hooks() *idem.Hooks {
	h := in.metricHooks()
	if in.cfg.clientSpans {
		spans := in.spanHook(context.Background())
		metrics := h.AttemptDone
		h.AttemptDone = func(a idem.AttemptInfo) {
			metrics(a)
			spans(a)
		}
	}
	return h
}

// RequestHooks returns hooks that make a span per attempt of the requests
// of ctx, as children of ctx's span, and record no metrics. Give them to
// idem.WithRequestHooks(ctx, ...).
func (in *Instrumentation) RequestHooks(ctx context.Context) *idem.Hooks {
	return &idem.Hooks{AttemptDone: in.spanHook(ctx)}
}

func (in *Instrumentation) metricHooks() *idem.Hooks {
	bg := context.Background()
	return &idem.Hooks{
		AttemptDone: func(a idem.AttemptInfo) {
			method := semconv.HTTPRequestMethodKey.String(a.Method)
			in.attempts.Add(bg, 1, metric.WithAttributes(method, KeyReason.String(a.Reason)))
			attrs := []attribute.KeyValue{method}
			if host, port := serverOf(a.URL); host != "" {
				attrs = append(attrs, semconv.ServerAddress(host))
				if port > 0 {
					attrs = append(attrs, semconv.ServerPort(port))
				}
			}
			if a.Status != 0 {
				attrs = append(attrs, semconv.HTTPResponseStatusCode(a.Status))
			}
			if et := errorType(a); et != "" {
				attrs = append(attrs, semconv.ErrorTypeKey.String(et))
			}
			in.duration.Record(bg, a.Latency.Seconds(), metric.WithAttributes(attrs...))
		},
		RetryScheduled: func(r idem.RetryInfo) {
			in.retries.Add(bg, 1, metric.WithAttributes(KeyReason.String(r.Reason), KeySource.String(r.Source)))
		},
		Settled: func(op idem.OperationInfo) {
			in.settled.Add(bg, 1, metric.WithAttributes(KeyState.String(op.State.String())))
		},
		InDoubt: func(op idem.OperationInfo, err error) {
			in.inDoubt.Add(bg, 1)
		},
		Resumed: func(op idem.OperationInfo, status int, err error) {
			attrs := []attribute.KeyValue{}
			if status != 0 {
				attrs = append(attrs, semconv.HTTPResponseStatusCode(status))
			}
			if err != nil {
				attrs = append(attrs, semconv.ErrorTypeKey.String(errorTypeOf(err)))
			}
			in.resumed.Add(bg, 1, metric.WithAttributes(attrs...))
		},
		Expired: func(op idem.OperationInfo) {
			in.expired.Add(bg, 1)
		},
	}
}

// spanHook returns an AttemptDone hook that makes one client span per
// attempt, as a child of parent's span.
func (in *Instrumentation) spanHook(parent context.Context) func(idem.AttemptInfo) {
	return func(a idem.AttemptInfo) {
		end := in.cfg.now()
		full := withoutQuery(a.URL)
		attrs := []attribute.KeyValue{
			semconv.HTTPRequestMethodKey.String(a.Method),
			semconv.URLFull(full),
			KeyKey.String(a.Key),
		}
		if host, port := serverOf(a.URL); host != "" {
			attrs = append(attrs, semconv.ServerAddress(host))
			if port > 0 {
				attrs = append(attrs, semconv.ServerPort(port))
			}
		}
		if a.Name != "" {
			attrs = append(attrs, KeyOperation.String(a.Name))
		}
		if resends := a.Earlier + a.Attempt - 1; resends > 0 {
			attrs = append(attrs, semconv.HTTPRequestResendCount(resends))
		}
		if a.Status != 0 {
			attrs = append(attrs, semconv.HTTPResponseStatusCode(a.Status))
		}
		if a.Reason != "" {
			attrs = append(attrs, KeyReason.String(a.Reason))
		}
		et := errorType(a)
		if et != "" {
			attrs = append(attrs, semconv.ErrorTypeKey.String(et))
		}
		ctx := parent
		if a.Context != nil && trace.SpanContextFromContext(a.Context).IsValid() {
			ctx = a.Context
		}
		_, span := in.tracer.Start(ctx, a.Method,
			trace.WithSpanKind(trace.SpanKindClient),
			trace.WithTimestamp(end.Add(-a.Latency)),
			trace.WithAttributes(attrs...))
		if et != "" {
			desc := ""
			if a.Err != nil {
				desc = a.Err.Error()
			}
			span.SetStatus(codes.Error, desc)
		}
		span.End(trace.WithTimestamp(end))
	}
}

// errorType is the error.type of an attempt: the status code for a 4xx or
// 5xx, idem's reason for an error without a response, or "".
func errorType(a idem.AttemptInfo) string {
	switch {
	case a.Status >= 400:
		return strconv.Itoa(a.Status)
	case a.Err != nil && a.Reason != "":
		return a.Reason
	case a.Err != nil:
		return errorTypeOf(a.Err)
	}
	return ""
}

// errorTypeOf names err for error.type: the idem sentinel it matches, or
// "_OTHER".
func errorTypeOf(err error) string {
	for _, s := range []struct {
		err  error
		name string
	}{
		{idem.ErrNoCredentials, "no_credentials"},
		{idem.ErrExpired, "expired"},
		{idem.ErrAttemptsExhausted, "attempts_exhausted"},
		{idem.ErrDeadline, "deadline"},
		{idem.ErrRetryTimeout, "retry_timeout"},
		{idem.ErrRetryBudget, "retry_budget"},
		{idem.ErrNotRetryable, "not_retryable"},
		{idem.ErrJournalCorrupt, "journal_corrupt"},
		{context.Canceled, "canceled"},
		{context.DeadlineExceeded, "timeout"},
	} {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	return semconv.ErrorTypeOther.Value.AsString()
}

// serverOf returns the host and port of raw, the port defaulted by
// scheme.
func serverOf(raw string) (string, int) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "", 0
	}
	host, portText := u.Hostname(), u.Port()
	if portText == "" {
		switch u.Scheme {
		case "http":
			return host, 80
		case "https":
			return host, 443
		}
		return host, 0
	}
	port, _ := strconv.Atoi(portText)
	return host, port
}

// withoutQuery returns raw without its query, fragment and user info.
func withoutQuery(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment, u.User = "", false, "", "", nil
	return u.String()
}
