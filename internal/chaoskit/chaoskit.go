// Package chaoskit is the driver shared by idem's chaos runs: the root
// package's chaos test, pgstore's fleet chaos test and the checkout demo.
// Each of them drives numbered operations through an idemtest provider
// that faults a share of the attempts, from client processes that are
// killed for real and restarted, and then proves from the provider's
// counters and the journal that every operation was performed exactly
// once under its journaled key.
//
// The kit holds what the three share; each keeps its own store, faults and
// story:
//
//   - the child's side: [Life] bounds a child's life, [Fatal] reports a
//     setup error, [ReadEnv] reads the shared environment, [ClientOptions]
//     and [SendRT] give a client that announces every attempt, [Done] and
//     [Succeeded] read what the journal records as done, [Pool] and [Try]
//     drive the operations, [Answer] tells a provider's answer;
//   - the parent's side: [Provider] is the faulty provider of [Orders],
//     [Flags] are a test's flags, [KillLife] kills a child
//     at a random point of its work ([KillPoint]), [Scan] reads a child's
//     lines, and a [Ledger] counts charges per operation and checks that
//     none is duplicated, lost, left pending or sent under a key the
//     journal does not hold ([Ledger.Assert]).
//
// The checkout demo re-executes itself as a plain program, not a test
// binary: it uses the pool, the tries, the answers and the ledger, and
// keeps its own process handling and lines.
//
// A chaos test's child writes its lines with [crashtest.Emit]: "todo <n>" first (the
// operations it has to do), then "send <key>" per attempt, "resumed <name>
// <status>" per resumed operation, "gaveup <name>" for an operation still
// failing after its tries, "fatal <msg>" on a setup error and "complete"
// after a clean Close.
package chaoskit

import (
	"flag"
	"math/rand/v2"
	"testing"
)

// Flags are the command-line flags of one chaos test, registered under a
// prefix: -<prefix>.ops, -<prefix>.kills, -<prefix>.workers and
// -<prefix>.seed.
type Flags struct {
	Ops     *int // operations driven
	Kills   *int // SIGKILLs over the run
	Workers *int // operations in flight at once per client process
	prefix  string
	seed    *uint64
}

// NewFlags registers a chaos test's flags on flag.CommandLine with the
// given defaults; what names the test in the flags' help. Call it from a
// package-level variable, as flag.Int is called.
func NewFlags(prefix, what string, ops, kills, workers int) *Flags {
	return &Flags{
		Ops:     flag.Int(prefix+".ops", ops, what+": number of operations"),
		Kills:   flag.Int(prefix+".kills", kills, what+": number of times a client process is SIGKILLed, over the run"),
		Workers: flag.Int(prefix+".workers", workers, what+": operations in flight at once per client process"),
		prefix:  prefix,
		seed:    flag.Uint64(prefix+".seed", 0, what+": seed of faults and kill points (0: random)"),
	}
}

// Seed returns the seed flag, or a random seed if it is 0, and logs it
// with the flag that reruns it.
func (f *Flags) Seed(t testing.TB) uint64 {
	t.Helper()
	seed := *f.seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("%s seed %d (rerun with -%s.seed=%d)", f.prefix, seed, f.prefix, seed)
	return seed
}
