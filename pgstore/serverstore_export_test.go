package pgstore

import "time"

// SetCallerClock makes s judge leases by the times its callers pass, as
// stores without a shared clock do, so that tests (the conformance suite)
// can move time without sleeping.
func SetCallerClock(s *ServerStore) { s.callerClock = true }

// SetEventClock makes s judge the expiry of Once's and Advance's records,
// and sweep them, by now instead of the database's clock.
func SetEventClock(s *ServerStore, now func() time.Time) { s.eventClock = now }
