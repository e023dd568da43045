package pgstore

// SetCallerClock makes s judge leases by the times its callers pass, as
// stores without a shared clock do, so that tests (the conformance suite)
// can move time without sleeping.
func SetCallerClock(s *ServerStore) { s.callerClock = true }
