package main

import (
	"fmt"
	"sync"
	"time"

	"github.com/idemgo/idem"
)

// envTrace asks the shop to trace an order (set by the -trace flag).
const envTrace = "IDEM_CHECKOUT_TRACE"

// tracer traces orders through idem's Hooks and keeps the trace of the
// first order that needed a retry.
type tracer struct {
	mu   sync.Mutex
	done bool // a trace was taken
}

// orderTrace is the trace of one order's payment.
type orderTrace struct {
	mu      sync.Mutex
	start   time.Time
	lines   []string
	retried bool
}

func (o *orderTrace) add(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	at := time.Since(o.start).Round(time.Millisecond)
	o.lines = append(o.lines, fmt.Sprintf("%+8s  ", at)+fmt.Sprintf(format, args...))
}

// hooks returns the hooks for one order, to pass with
// idem.WithRequestHooks, and its trace.
func (tr *tracer) hooks() (*idem.Hooks, *orderTrace) {
	o := &orderTrace{start: time.Now()}
	return &idem.Hooks{
		AttemptDone: func(a idem.AttemptInfo) {
			got := fmt.Sprint(a.Status)
			if a.Err != nil {
				got = "no response: " + a.Reason
			}
			o.add("attempt %d  %s %s  key %s  -> %s in %s", a.Attempt, a.Method, a.URL, a.Key, got, a.Latency.Round(time.Millisecond))
		},
		RetryScheduled: func(r idem.RetryInfo) {
			o.mu.Lock()
			o.retried = true
			o.mu.Unlock()
			o.add("retry     after %s (%s), because %s; same key, same body", r.Delay.Round(time.Millisecond), r.Source, r.Reason)
		},
		Settled: func(op idem.OperationInfo) {
			o.add("settled   %s %s after %d attempts: the journal accepted its finish mark: Resume will not send it again", op.Name, op.State, op.Attempts)
		},
		InDoubt: func(op idem.OperationInfo, err error) {
			o.add("in doubt  %s: %v; it stays pending, the shop re-drives it by name", op.Name, err)
		},
	}, o
}

// take returns o's lines if o is the first retried order traced, else nil.
func (tr *tracer) take(o *orderTrace) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.done || !o.retried {
		return nil
	}
	tr.done = true
	return o.lines
}
