package pgstore

import "time"

// SetCallerClock makes s judge leases by the times its callers pass, as
// stores without a shared clock do, so that tests (the conformance suite)
// can move time without sleeping.
func SetCallerClock(s *ServerStore) { s.callerClock = true }

// SetEventClock makes s judge the expiry of Once's and Advance's records,
// and sweep them, by now instead of the database's clock.
func SetEventClock(s *ServerStore, now func() time.Time) { s.eventClock = now }

// ReserveQueued is how many reservations wait in s's queue for a group,
// the group being sent included.
func ReserveQueued(s *Store) int {
	s.reserver.mu.Lock()
	defer s.reserver.mu.Unlock()
	return len(s.reserver.queue) + s.reserver.sending
}

// MarksQueued is how many marks wait in s's queue, the batch being
// written included.
func MarksQueued(s *Store) int {
	s.marks.mu.Lock()
	defer s.marks.mu.Unlock()
	return len(s.marks.queue)
}
