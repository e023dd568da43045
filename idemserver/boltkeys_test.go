package idemserver

import (
	"context"
	"fmt"
	"time"
)

// The helpers of the BoltStore's internal tests: a key's claim and
// completion as the middleware makes them, fingerprint "fp", and the
// index read under its lock.

// beginAt claims id at now with a minute's lease.
func beginAt(s *BoltStore, id string, now time.Time) (Claim, error) {
	return s.Begin(context.Background(), Begin{ID: id, Fingerprint: "fp", Now: now, LeaseUntil: now.Add(time.Minute)})
}

// completeAt claims the new key id at now and stores resp for it until
// until.
func completeAt(s *BoltStore, id string, now time.Time, resp *Response, until time.Time) error {
	c, err := beginAt(s, id, now)
	if err != nil {
		return err
	}
	if c.State != StateAcquired {
		return fmt.Errorf("%s at %v: %v, want acquired", id, now, c.State)
	}
	return s.Complete(context.Background(), Completion{ID: id, Token: c.Token, Response: resp, Now: now, Until: until})
}

// indexLen returns how many keys the index of s holds.
func indexLen(s *BoltStore) int {
	s.flights.mu.Lock()
	defer s.flights.mu.Unlock()
	return s.flights.indexed()
}

// indexHas reports whether the index of s holds id.
func indexHas(s *BoltStore, id string) bool {
	s.flights.mu.Lock()
	defer s.flights.mu.Unlock()
	_, ok := s.flights.lookup(id)
	return ok
}
