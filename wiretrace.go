package idem

// How an operation counts the requests net/http writes for it: an
// httptrace.ClientTrace in a context the operation holds.

import (
	"context"
	"net/http/httptrace"
	"time"
)

// traced returns ctx with the operation's httptrace.ClientTrace, which
// counts the requests written; httptrace.WithClientTrace composes it with
// a trace ctx has of its own.
//
// It costs the context httptrace.WithClientTrace allocates. The operation
// used to hold that context itself, answering httptrace's key, which it
// found by probing httptrace.ContextClientTrace with a context that noted
// the key asked for: one allocation saved per keyed request, against a
// dependence on how an unexported key of the standard library is looked
// up (a change there would have left idem's count of requests written,
// and so net/http's silent replays, to the fallback of one per attempt).
func (o *operation) traced(ctx context.Context) context.Context {
	o.trace.WroteHeaders = o.countWrite
	return httptrace.WithClientTrace(ctx, &o.trace)
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
