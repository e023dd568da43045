package idemserver

import "time"

// SetClock replaces the middleware's clock, for tests whose time cannot be
// a synctest bubble's: a crashed child process wrote leases with its own.
func SetClock(m *Middleware, now func() time.Time) { m.now = now }

// Buffered returns the bytes keyed requests in flight have reserved (see
// WithMaxBufferedBytes).
func Buffered(m *Middleware) int64 { return m.buffered.used.Load() }
