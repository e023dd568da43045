package chaoskit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemtest"
)

// Ledger is what a chaos run did, from the provider's counters and ledger
// and from the journal: the figures a run reports and the ones it must
// keep at zero. Build it with Tally, then check the journal with Named
// and Foreign, and count its Pending operations.
type Ledger struct {
	Ops       int                    // operations driven
	Requests  int                    // requests the provider received, faulted ones included
	Runs      int                    // times the provider's handler ran
	Replays   int                    // stored answers replayed
	Conflicts int                    // real 409s: a key still being handled
	Faults    map[idemtest.Fault]int // faults injected, by kind
	Paid      int                    // operations performed at least once

	Duplicates   int // operations performed more than once, or keys run more than once
	Lost         int // operations never performed
	NotSucceeded int // named operations the journal does not record as succeeded
	WrongKey     int // named operations not performed exactly once under their journaled key
	Pending      int // operations left pending in the journal
	ForeignKeys  int // keys on the wire that the journal does not hold

	stats     idemtest.Stats
	journaled map[string]bool
}

// Charges returns how many times an idemtest provider performed each of n
// operations, operation i being a request method path with body(i). Give
// each operation a distinct body.
func Charges(st idemtest.Stats, n int, method, path string, body func(i int) string) []int {
	charges := make([]int, n)
	for i := range charges {
		charges[i] = st.RunsByPayload[idemtest.Fingerprint(method, path, []byte(body(i)))]
	}
	return charges
}

// PostCharges is Charges of POST requests.
func PostCharges(st idemtest.Stats, n int, path string, body func(i int) string) []int {
	return Charges(st, n, http.MethodPost, path, body)
}

// Tally starts the ledger of a run of len(charges) operations from the
// provider's counters st, charges[i] being the times operation i was
// performed: an operation performed never is lost, more than once (or a
// key run more than once) a duplicate.
func Tally(st idemtest.Stats, charges []int) *Ledger {
	l := &Ledger{
		Ops: len(charges), Requests: st.Requests, Runs: st.Runs, Replays: st.Replays,
		Conflicts: st.Conflicts, Faults: st.Faults,
		stats: st, journaled: make(map[string]bool),
	}
	for _, c := range charges {
		switch {
		case c == 0:
			l.Lost++
		case c > 1:
			l.Duplicates++
		}
		if c > 0 {
			l.Paid++
		}
	}
	l.Duplicates = max(l.Duplicates, st.DuplicateKeys())
	return l
}

// Named checks the journal's records of the named operations: each must
// be there, succeeded, and performed exactly once under its key. It
// returns the journal's first error other than idem.ErrNotFound.
func (l *Ledger) Named(ctx context.Context, lookup Lookup, names []string) error {
	for _, name := range names {
		op, err := lookup(ctx, name)
		if errors.Is(err, idem.ErrNotFound) {
			l.NotSucceeded++
			continue
		}
		if err != nil {
			return errLookup(name, err)
		}
		l.journaled[op.Key] = true
		if op.State != idem.StateSucceeded {
			l.NotSucceeded++
		}
		if l.stats.RunsByKey[op.Key] != 1 {
			l.WrongKey++
		}
	}
	return nil
}

// Foreign counts the keys the provider received that the journal does not
// hold: neither a named operation's (see Named) nor one that held, if not
// nil, accepts.
func (l *Ledger) Foreign(held func(key string, runs int) bool) {
	for k := range l.stats.AttemptsByKey {
		if l.journaled[k] || held != nil && held(k, l.stats.RunsByKey[k]) {
			continue
		}
		l.ForeignKeys++
	}
}

// Assert checks the ledger of a run that must be exactly once: no
// operation duplicated, lost, not succeeded, pending or performed under
// another key than its journaled one, no key on the wire the journal does
// not hold, and one handler run per operation.
func (l *Ledger) Assert(t testing.TB) {
	t.Helper()
	assert.Zero(t, l.Duplicates, "operations performed more than once")
	assert.Zero(t, l.Lost, "operations never performed")
	assert.Zero(t, l.NotSucceeded, "operations the journal does not record as succeeded")
	assert.Zero(t, l.Pending, "operations left pending in the journal")
	assert.Zero(t, l.ForeignKeys, "keys on the wire that the journal does not hold")
	assert.Zero(t, l.WrongKey, "operations not performed exactly once under their journaled key")
	assert.Equal(t, l.Ops, l.Runs, "handler runs")
}

// String is the ledger in one log line.
func (l *Ledger) String() string {
	return fmt.Sprintf("%d operations, %d requests (%.3f per operation), %d handler runs, %d replays, %d conflicts, faults %s; "+
		"%d duplicates, %d lost, %d not succeeded, %d left pending, %d foreign keys, %d not performed once under their key",
		l.Ops, l.Requests, float64(l.Requests)/float64(max(l.Ops, 1)), l.Runs, l.Replays, l.Conflicts, FaultKinds(l.Faults),
		l.Duplicates, l.Lost, l.NotSucceeded, l.Pending, l.ForeignKeys, l.WrongKey)
}
