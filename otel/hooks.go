package idemotel

import (
	"context"
	"encoding/hex"
	"errors"
	"net/url"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgo/idem"
)

// Hooks returns the hooks that record metrics, and spans unless
// WithoutClientSpans was given. Give them to idem.WithHooks; they add to
// any other hooks the Client has. Give the same hooks to idem.Open (or
// their JournalCommit to BoltOptions.OnCommit) for the commit histogram.
//
// They also journal the trace context of each new operation
// (idem.Hooks.TraceContext: the W3C traceparent of the request context's
// span), so that when the operation is sent again later, by Resume in
// another process or by a re-drive in another trace, its span links to
// the span it was first sent under (a span link, as OpenTelemetry
// recommends for work that continues outside its original trace).
func (in *Instrumentation) Hooks() *idem.Hooks {
	h := in.metricHooks()
	h.TraceContext = TraceParent
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

// RequestHooks returns hooks that make a span per request of the requests
// of ctx, as children of ctx's span, and record no metrics. Give them to
// idem.WithRequestHooks(ctx, ...).
func (in *Instrumentation) RequestHooks(ctx context.Context) *idem.Hooks {
	return &idem.Hooks{AttemptDone: in.spanHook(ctx), TraceContext: TraceParent}
}

// TraceParent returns the W3C traceparent of ctx's span
// (version-traceid-spanid-flags), or "" if ctx has no valid span: the
// idem.Hooks.TraceContext that Hooks and RequestHooks set.
func TraceParent(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	var b [55]byte // one allocation: the string
	tid, sid, flags := sc.TraceID(), sc.SpanID(), sc.TraceFlags()
	copy(b[:], "00-")
	hex.Encode(b[3:35], tid[:])
	b[35] = '-'
	hex.Encode(b[36:52], sid[:])
	b[52] = '-'
	hex.Encode(b[53:], []byte{byte(flags)})
	return string(b[:])
}

// originalLink returns the link from a resent request's span to the span
// its operation was first sent under (a.Trace), or false when there is
// none to add: not a resend, no journaled trace, or the same trace as
// the span's own parent.
func originalLink(ctx context.Context, a idem.AttemptInfo) (trace.Link, bool) {
	if !a.Resend || a.Trace == "" {
		return trace.Link{}, false
	}
	orig := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": a.Trace}))
	if !orig.IsValid() || orig.TraceID() == trace.SpanContextFromContext(ctx).TraceID() {
		return trace.Link{}, false
	}
	return trace.Link{SpanContext: orig}, true
}

func (in *Instrumentation) metricHooks() *idem.Hooks {
	bg := context.Background()
	return &idem.Hooks{
		AttemptDone: func(a idem.AttemptInfo) {
			method := semconv.HTTPRequestMethodKey.String(a.Method)
			in.attempts.Add(bg, 1, metric.WithAttributes(method, KeyReason.String(a.Reason)))
			attrs := append(make([]attribute.KeyValue, 0, 6), method)
			attrs = appendServer(attrs, a.URL)
			if a.Status != 0 {
				attrs = append(attrs, semconv.HTTPResponseStatusCode(a.Status))
			}
			if a.Protocol != "" {
				attrs = append(attrs, semconv.NetworkProtocolVersion(a.Protocol))
			}
			if et := attemptErrorType(a); et != "" {
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
			var attrs []attribute.KeyValue
			if status != 0 {
				attrs = append(attrs, semconv.HTTPResponseStatusCode(status))
			}
			if err != nil {
				attrs = append(attrs, semconv.ErrorTypeKey.String(ErrorType(err)))
			}
			in.resumed.Add(bg, 1, metric.WithAttributes(attrs...))
		},
		Expired: func(op idem.OperationInfo) {
			in.expired.Add(bg, 1)
		},
		JournalCommit: func(c idem.JournalCommitInfo) {
			in.commit.Record(bg, c.Latency.Seconds())
			if c.Err != nil {
				in.journalErrors.Add(bg, 1, metric.WithAttributes(KeyWrite.String("commit"), semconv.ErrorTypeKey.String(ErrorType(c.Err))))
			}
		},
		JournalError: func(e idem.JournalErrorInfo) {
			in.journalErrors.Add(bg, 1, metric.WithAttributes(KeyWrite.String(e.Write), semconv.ErrorTypeKey.String(ErrorType(e.Err))))
		},
	}
}

// spanHook returns an AttemptDone hook that makes one client span per
// request, as a child of parent's span unless the request's context has
// one.
func (in *Instrumentation) spanHook(parent context.Context) func(idem.AttemptInfo) {
	return func(a idem.AttemptInfo) {
		end := in.cfg.now()
		attrs := append(make([]attribute.KeyValue, 0, 12),
			semconv.HTTPRequestMethodKey.String(a.Method),
			semconv.URLFull(in.fullURL(a.URL)),
			KeyKey.String(a.Key))
		attrs = appendServer(attrs, a.URL)
		if a.Name != "" {
			attrs = append(attrs, KeyOperation.String(a.Name))
		}
		if resends := a.Earlier + a.Attempt - 1; resends > 0 {
			attrs = append(attrs, semconv.HTTPRequestResendCount(resends))
		}
		if a.Status != 0 {
			attrs = append(attrs, semconv.HTTPResponseStatusCode(a.Status))
		}
		if a.Protocol != "" {
			attrs = append(attrs, semconv.NetworkProtocolVersion(a.Protocol))
		}
		if a.Reason != "" {
			attrs = append(attrs, KeyReason.String(a.Reason))
		}
		et := attemptErrorType(a)
		if et != "" {
			attrs = append(attrs, semconv.ErrorTypeKey.String(et))
		}
		ctx := parent
		if a.Context != nil && trace.SpanContextFromContext(a.Context).IsValid() {
			ctx = a.Context
		}
		opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient),
			trace.WithTimestamp(end.Add(-a.Latency)),
			trace.WithAttributes(attrs...)}
		if link, ok := originalLink(ctx, a); ok {
			opts = append(opts, trace.WithLinks(link))
		}
		_, span := in.tracer.Start(ctx, a.Method, opts...)
		if et != "" {
			desc := ""
			if a.Err != nil {
				desc = idem.RedactText(a.Err.Error()) // a *url.Error quotes the URL as sent
			}
			span.SetStatus(codes.Error, desc)
		}
		span.End(trace.WithTimestamp(end))
	}
}

// appendServer appends server.address and server.port of raw, the port
// defaulted by scheme.
func appendServer(attrs []attribute.KeyValue, raw string) []attribute.KeyValue {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return attrs
	}
	attrs = append(attrs, semconv.ServerAddress(u.Hostname()))
	port, _ := strconv.Atoi(u.Port())
	if port == 0 {
		switch u.Scheme {
		case "http":
			port = 80
		case "https":
			port = 443
		}
	}
	if port > 0 {
		attrs = append(attrs, semconv.ServerPort(port))
	}
	return attrs
}

// attemptErrorType is the error.type of an attempt (see the package doc),
// or "" for one that did not fail.
func attemptErrorType(a idem.AttemptInfo) string {
	switch {
	case a.Status >= 400:
		return strconv.Itoa(a.Status)
	case a.Err == nil:
		return ""
	case errors.Is(a.Err, context.Canceled):
		return "canceled"
	case errors.Is(a.Err, context.DeadlineExceeded):
		return "timeout"
	case a.Reason != "" && a.Reason != "context done":
		return strings.ReplaceAll(a.Reason, " ", "_")
	}
	return ErrorType(a.Err)
}

// ErrorType returns the error.type this package gives err: the name of
// the idem error or context error it matches (see the package doc), or
// "_OTHER".
func ErrorType(err error) string {
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
		{idem.ErrInProgress, "in_progress"},
		{idem.ErrKeyReused, "key_reused"},
		{idem.ErrJournalWrite, "journal_write"},
		{idem.ErrJournalCorrupt, "journal_corrupt"},
		{idem.ErrClosed, "closed"},
		{context.Canceled, "canceled"},
		{context.DeadlineExceeded, "timeout"},
	} {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	return semconv.ErrorTypeOther.Value.AsString()
}

// fullURL returns raw for url.full as idem.RedactURL shows it: user info
// as REDACTED:REDACTED, the values of idem's secret query parameters
// (idem.DefaultSecretQueryParams, which hold the conventions' list) and of
// those WithRedactedQueryParams names as REDACTED, no fragment.
func (in *Instrumentation) fullURL(raw string) string {
	return idem.RedactURL(raw, in.cfg.redact...)
}
