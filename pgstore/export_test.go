package pgstore

import "time"

// WithCallerLeaseTimes judges leases by the times the caller passes, not
// the database's clock: for the conformance suite, whose times are
// synthetic.
func WithCallerLeaseTimes() Option { return func(c *config) { c.callerTimes = true } }

// WithSkew makes the store move every time its caller passes (Created,
// Updated, a lease's At and Until) by d, as a Client whose clock is d off
// and whose offset to the database's clock is wrong would pass them.
func WithSkew(d time.Duration) Option { return func(c *config) { c.skew = d } }
