package idem

// How an operation counts the requests net/http writes for it: an
// httptrace.ClientTrace in a context the operation holds.

import (
	"context"
	"net/http/httptrace"
	"time"
)

// traced returns ctx with the operation's httptrace.ClientTrace, which
// counts the requests written: a context the operation holds, unless ctx
// has a trace of its own, which httptrace.WithClientTrace composes with
// the operation's.
func (o *operation) traced(ctx context.Context) context.Context {
	o.trace.WroteHeaders = o.countWrite
	if traceKey == nil || httptrace.ContextClientTrace(ctx) != nil {
		return httptrace.WithClientTrace(ctx, &o.trace)
	}
	o.ctx = tracedCtx{Context: ctx, trace: &o.trace}
	return &o.ctx
}

// tracedCtx is a context with a ClientTrace, as httptrace.WithClientTrace
// makes one for a context without a trace, but held by the operation
// instead of allocated: its Value answers httptrace's key with the trace
// and passes every other key on.
type tracedCtx struct {
	context.Context
	trace *httptrace.ClientTrace
}

func (c *tracedCtx) Value(key any) any {
	if key == traceKey {
		return c.trace
	}
	return c.Context.Value(key)
}

// traceKey is the key under which httptrace.ContextClientTrace looks up
// a context's trace, found by asking it, or nil if it asked for none.
var traceKey = func() any {
	p := keyProbe{Context: context.Background()}
	httptrace.ContextClientTrace(&p)
	return p.key
}()

// keyProbe is a context that notes the key it was last asked for.
type keyProbe struct {
	context.Context
	key any
}

func (p *keyProbe) Value(key any) any {
	p.key = key
	return nil
}

// countWrite counts one request written, and notes the time of every one
// after an attempt's first: net/http's silent replays.
func (o *operation) countWrite() {
	if o.wrote.Add(1) > 1 {
		o.replayMu.Lock()
		o.replayAt = append(o.replayAt, time.Now())
		o.replayMu.Unlock()
	}
}
