package idemtest

import "maps"

// Stats is a snapshot of a Server's counters, taken by Server.Stats. The
// maps belong to the caller.
//
// Per-key counts use the key as sent (unquoted), whatever the method and
// path; requests without a key are counted under "".
type Stats struct {
	// Requests counts the requests received, including faulted ones.
	Requests int
	// AttemptsByKey counts the requests received per key.
	AttemptsByKey map[string]int
	// Runs counts the times the wrapped handler ran.
	Runs int
	// RunsByKey counts the times the wrapped handler ran per key.
	RunsByKey map[string]int
	// RunsByPayload counts the times the wrapped handler ran per payload
	// fingerprint (see Fingerprint), with or without a key.
	RunsByPayload map[string]int
	// Replays counts the stored responses replayed.
	Replays int
	// Conflicts counts the 409 answers to a key whose first request was
	// still being handled (injected InProgress faults are not included).
	Conflicts int
	// Mismatches counts the 422 answers to a key reused with another payload.
	Mismatches int
	// MissingKeys counts the 400 answers to a POST or PATCH without a key
	// (see WithRequireKey).
	MissingKeys int
	// Faults counts the faults injected, by kind.
	Faults map[Fault]int
	// Keys is the number of scoped keys the server holds: in flight, or
	// completed and not yet swept away. Expired results are swept from time
	// to time, so Keys may include some until then.
	Keys int
}

// DuplicateKeys returns how many keys the wrapped handler ran for more
// than once. Requests without a key are not counted here.
//
// A handler that answered 5xx runs again on retry by design, so each such
// answer counts as a run.
func (s Stats) DuplicateKeys() int {
	n := 0
	for k, runs := range s.RunsByKey {
		if k != "" && runs > 1 {
			n++
		}
	}
	return n
}

// DuplicatePayloads returns how many payload fingerprints the wrapped
// handler ran for more than once, with or without a key. It catches a
// client that sends the same operation again under a new key, or none; it
// also counts distinct operations that happen to share a payload, so give
// each operation a distinct body when asserting on it.
func (s Stats) DuplicatePayloads() int {
	n := 0
	for _, runs := range s.RunsByPayload {
		if runs > 1 {
			n++
		}
	}
	return n
}

func newStats() Stats {
	return Stats{
		AttemptsByKey: make(map[string]int),
		RunsByKey:     make(map[string]int),
		RunsByPayload: make(map[string]int),
		Faults:        make(map[Fault]int),
	}
}

func (s Stats) clone() Stats {
	c := s
	c.AttemptsByKey = maps.Clone(s.AttemptsByKey)
	c.RunsByKey = maps.Clone(s.RunsByKey)
	c.RunsByPayload = maps.Clone(s.RunsByPayload)
	c.Faults = maps.Clone(s.Faults)
	return c
}
