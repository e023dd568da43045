// Package idemotel reports what idem does to OpenTelemetry: a client span
// and a duration sample per request written, under the HTTP client
// semantic conventions (v1.40.0, the version of the semconv package this
// module pins: SchemaURL); counters of attempts, retries and operation
// outcomes; gauges for the pending operations and the age of the oldest
// one in doubt; and the journal's health (commit latency, failed writes,
// file size).
//
// It is a module of its own (github.com/idemgo/idem/otel), so that idem's
// core does not depend on OpenTelemetry.
//
//	in, err := idemotel.New(store) // store: the Client's KeyStore, or nil
//	if err != nil { ... }
//	client := idem.New(store, idem.WithHooks(in.Hooks()))
//	defer client.Close()
//	defer in.Shutdown() // runs first: the gauges stop reading the store
//
// idem calls its hooks after an attempt, so each span is created with the
// attempt's start time (now minus its latency) and ended at once, as a
// child of the span in the request's context (AttemptInfo.Context).
// RequestHooks(ctx) parents spans to ctx's span instead, for requests whose
// context carries none; build the Instrumentation WithoutClientSpans then,
// so each request has one span.
//
// A request sent again after its call ended (by Resume, in this process
// or another, or by a re-drive in another trace) is not in the trace it
// was first sent in: its span is a child of the context it is sent under
// (a root span for a background Resume) with a span link to the span the
// operation was first journaled under. The hooks journal that span's W3C
// traceparent with each new operation (idem.Hooks.TraceContext,
// TraceParent); it is not a secret, and only a resend reads it back
// (idem.OperationInfo.Trace).
//
// # Names
//
// Every metric of idem's own is in the idem namespace (the Metric
// constants); the request duration is the conventions'
// http.client.request.duration, with their explicit bucket boundaries
// (DurationBuckets). Attributes are the conventions' where they have one
// (http.request.method, server.address, server.port, url.full,
// http.response.status_code, http.request.resend_count,
// network.protocol.version, error.type) and idem's otherwise (the Key
// constants).
//
// # error.type
//
// error.type takes one of these values, the same for one cause on spans
// and metrics:
//
//   - the status code ("503") for a response of 400 or above;
//   - for an attempt that got no response, how idem classified it:
//     "connection_failed" (nothing sent), "connection_closed",
//     "timeout", "dns_lookup_failed", "host_not_found",
//     "tls_verification_failed", "network_error"; "canceled" when the
//     caller's context was cancelled ("timeout" for its deadline);
//   - for an operation Resume could not finish, the idem error it
//     matches: "no_credentials", "expired", "attempts_exhausted",
//     "deadline", "retry_timeout", "retry_budget", "not_retryable",
//     "in_progress", "key_reused", "journal_write", "journal_corrupt",
//     "closed";
//   - "_OTHER" for anything else.
package idemotel

import (
	"context"
	"errors"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgo/idem"
)

// ScopeName is the instrumentation scope of the tracer and meter.
const ScopeName = "github.com/idemgo/idem/otel"

// SchemaURL is the semantic conventions' schema the telemetry follows.
const SchemaURL = semconv.SchemaURL

// Metric names of idem's own instruments, all in the idem namespace.
const (
	// MetricAttempts counts requests written under a key ({attempt}), by
	// http.request.method and idem.reason.
	MetricAttempts = "idem.attempts"
	// MetricRetries counts retries scheduled ({retry}), by idem.reason
	// and idem.retry.delay_source.
	MetricRetries = "idem.retries"
	// MetricSettled counts operations whose caller received the answer
	// and whose finish mark the journal accepted ({operation}), by
	// idem.state.
	MetricSettled = "idem.operation.settled"
	// MetricLeftInDoubt counts operations left pending without an answer
	// for the caller ({operation}).
	MetricLeftInDoubt = "idem.operation.left_in_doubt"
	// MetricResumed counts operations Resume sent again ({operation}), by
	// http.response.status_code or error.type.
	MetricResumed = "idem.operation.resumed"
	// MetricExpired counts operations given up unsent past the resend
	// window ({operation}).
	MetricExpired = "idem.operation.expired"
	// MetricPending is a gauge of the operations pending in the journal
	// ({operation}), by idem.lease: "live" (being sent) or "lapsed" (in
	// doubt).
	MetricPending = "idem.operation.pending"
	// MetricOldestInDoubt is a gauge of the age of the oldest operation in
	// doubt (s); 0 when none.
	MetricOldestInDoubt = "idem.operation.in_doubt.oldest_age"
	// MetricCommitDuration is a histogram of the journal's commit
	// latency, fsyncs included (s), from the JournalCommit hook.
	MetricCommitDuration = "idem.journal.commit.duration"
	// MetricJournalErrors counts journal writes that failed ({error}), by
	// idem.journal.write ("reserve", "attempt", "finish", "lease",
	// "commit") and error.type.
	MetricJournalErrors = "idem.journal.errors"
	// MetricJournalSize is a gauge of the journal file's size (By), with
	// WithJournalFile.
	MetricJournalSize = "idem.journal.file.size"
)

// DurationBuckets are the explicit bucket boundaries (s) of
// http.client.request.duration, as the HTTP semantic conventions give
// them.
var DurationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// CommitBuckets are the bucket boundaries (s) of
// idem.journal.commit.duration: one fsync of one page takes about 0.2 ms,
// a bbolt commit of a group 1 to 2 ms.
var CommitBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}

// Attribute keys of idem's own, beside the semantic conventions'.
const (
	KeyKey       = attribute.Key("idem.key")
	KeyOperation = attribute.Key("idem.operation")
	KeyReason    = attribute.Key("idem.reason")
	KeyState     = attribute.Key("idem.state")
	KeySource    = attribute.Key("idem.retry.delay_source")
	KeyLease     = attribute.Key("idem.lease")
	KeyWrite     = attribute.Key("idem.journal.write")
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
	file        string
	redact      []string // more query parameters url.full redacts
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

// WithJournalFile reports the size of the journal file at path (the path
// given to idem.Open or idem.OpenBoltStore) as idem.journal.file.size.
func WithJournalFile(path string) Option { return func(c *config) { c.file = path } }

// WithRedactedQueryParams adds query parameters, matched without regard
// to case, whose values url.full shows as REDACTED, besides
// idem.DefaultSecretQueryParams (which hold those the conventions name:
// AWSAccessKeyId, Signature, sig, X-Goog-Signature). idem does not journal
// its secret parameters at all (nor those of the client's
// WithSecretQueryParams), so those never reach url.full.
func WithRedactedQueryParams(names ...string) Option {
	return func(c *config) { c.redact = append(c.redact, names...) }
}

// Instrumentation turns idem's hooks into spans and metrics. It is safe
// for concurrent use.
type Instrumentation struct {
	cfg    config
	tracer trace.Tracer
	reg    metric.Registration // the gauges' callback, or nil

	attempts      metric.Int64Counter
	duration      metric.Float64Histogram
	retries       metric.Int64Counter
	settled       metric.Int64Counter
	inDoubt       metric.Int64Counter
	resumed       metric.Int64Counter
	expired       metric.Int64Counter
	commit        metric.Float64Histogram
	journalErrors metric.Int64Counter
	pending       metric.Int64ObservableGauge
	oldestAge     metric.Float64ObservableGauge
	fileSize      metric.Int64ObservableGauge
	shutdownMu    sync.Mutex
}

// maxWalk caps how many pending operations one collection of the gauges
// reads.
const maxWalk = 100_000

// walkPage is how many pending operations one read of that walk asks for.
const walkPage = 500

// Version returns the version of this module as the build records it, or
// "(devel)" in a workspace or a build from source.
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(devel)"
	}
	if bi.Main.Path == "github.com/idemgo/idem/otel" && bi.Main.Version != "" {
		return bi.Main.Version
	}
	for _, d := range bi.Deps {
		if d.Path == "github.com/idemgo/idem/otel" {
			if d.Replace != nil && d.Replace.Version != "" {
				return d.Replace.Version
			}
			return d.Version
		}
	}
	return "(devel)"
}

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
	version := Version()
	in := &Instrumentation{cfg: cfg, tracer: cfg.tp.Tracer(ScopeName,
		trace.WithInstrumentationVersion(version), trace.WithSchemaURL(SchemaURL))}
	m := cfg.mp.Meter(ScopeName, metric.WithInstrumentationVersion(version), metric.WithSchemaURL(SchemaURL))
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	var err error
	in.attempts, err = m.Int64Counter(MetricAttempts, metric.WithUnit("{attempt}"),
		metric.WithDescription("Requests written under an idempotency key, by how idem classified their outcome."))
	add(err)
	in.duration, err = m.Float64Histogram("http.client.request.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of HTTP client requests."),
		metric.WithExplicitBucketBoundaries(DurationBuckets...))
	add(err)
	in.retries, err = m.Int64Counter(MetricRetries, metric.WithUnit("{retry}"),
		metric.WithDescription("Retries scheduled, by the reason of the failed attempt and what set the delay."))
	add(err)
	in.settled, err = m.Int64Counter(MetricSettled, metric.WithUnit("{operation}"),
		metric.WithDescription("Operations whose caller received the answer, by final state."))
	add(err)
	in.inDoubt, err = m.Int64Counter(MetricLeftInDoubt, metric.WithUnit("{operation}"),
		metric.WithDescription("Operations left pending without an answer for the caller."))
	add(err)
	in.resumed, err = m.Int64Counter(MetricResumed, metric.WithUnit("{operation}"),
		metric.WithDescription("Operations Resume sent again."))
	add(err)
	in.expired, err = m.Int64Counter(MetricExpired, metric.WithUnit("{operation}"),
		metric.WithDescription("Operations given up unsent past the resend window."))
	add(err)
	in.commit, err = m.Float64Histogram(MetricCommitDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of journal commits, fsyncs included."),
		metric.WithExplicitBucketBoundaries(CommitBuckets...))
	add(err)
	in.journalErrors, err = m.Int64Counter(MetricJournalErrors, metric.WithUnit("{error}"),
		metric.WithDescription("Journal writes that failed, by write."))
	add(err)
	var observed []metric.Observable
	if journal != nil {
		in.pending, err = m.Int64ObservableGauge(MetricPending, metric.WithUnit("{operation}"),
			metric.WithDescription("Operations pending in the journal, by lease: live (being sent) or lapsed (in doubt)."))
		add(err)
		in.oldestAge, err = m.Float64ObservableGauge(MetricOldestInDoubt, metric.WithUnit("s"),
			metric.WithDescription("Age of the oldest operation in doubt (pending under no live lease); 0 when none."))
		add(err)
		observed = append(observed, in.pending, in.oldestAge)
	}
	if cfg.file != "" {
		in.fileSize, err = m.Int64ObservableGauge(MetricJournalSize, metric.WithUnit("By"),
			metric.WithDescription("Size of the journal file."))
		add(err)
		observed = append(observed, in.fileSize)
	}
	if err := errors.Join(errs...); err == nil && len(observed) > 0 {
		in.reg, err = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
			return in.observe(ctx, journal, o)
		}, observed...)
		add(err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return in, nil
}

// Shutdown stops the gauges' reading of the journal. Call it before the
// journal is closed; a collection that finds the journal closed observes
// nothing and reports no error, so the natural order of defers (Shutdown
// deferred after Close, so it runs first) and the reverse both work.
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

// observe reads the journal's pending operations and the file's size for
// the gauges.
func (in *Instrumentation) observe(ctx context.Context, j Journal, o metric.Observer) error {
	var errs []error
	if in.cfg.file != "" {
		if fi, err := os.Stat(in.cfg.file); err == nil {
			o.ObserveInt64(in.fileSize, fi.Size())
		} else if !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if j != nil {
		errs = append(errs, in.observePending(ctx, j, o))
	}
	return errors.Join(errs...)
}

// observePending reads the journal's pending operations for the gauges.
func (in *Instrumentation) observePending(ctx context.Context, j Journal, o metric.Observer) error {
	now := in.cfg.now()
	var (
		live, lapsed int64
		oldest       time.Time
		errs         []error
		seen         int
	)
	for after := ""; seen < maxWalk; {
		page, err := j.Pending(ctx, after, walkPage)
		if errors.Is(err, idem.ErrClosed) {
			return nil // the Client closed before Shutdown: nothing to observe
		}
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
		if len(page) < walkPage {
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
