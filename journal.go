package idem

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// journal is what an operation needs of its surroundings: the store, this
// process's name and lease, the in-flight registry and the index of recent
// calls a resend may belong to. Transport and Resume share one.
type journal struct {
	store        KeyStore
	owner        string
	lease        time.Duration
	resendWindow time.Duration
	matchWindow  time.Duration
	retention    time.Duration
	log          *slog.Logger

	flight inflight
	recent recentCalls
	calls  calls

	lastSweep atomic.Int64   // when finished records were last swept (Unix ns)
	sweeps    sync.WaitGroup // sweeps running, for Close
	// anchor is when the journal last changed before this Client opened
	// it, if the store says, and opened is when that was read (with its
	// monotonic reading).
	anchor, opened time.Time

	renewMu      sync.Mutex
	renewT       *time.Timer
	renewArmed   atomic.Bool // read without renewMu on the hot path, written under it
	renewStopped bool
}

// lastChanger is implemented by stores that know when they last changed.
type lastChanger interface {
	LastChange(ctx context.Context) (time.Time, error)
}

// anchorClock reads the store's last change, which bounds how far the
// sweeps of this Client trust the wall clock.
func (j *journal) anchorClock() {
	j.opened = time.Now()
	if lc, ok := j.store.(lastChanger); ok {
		if t, err := lc.LastChange(context.Background()); err == nil {
			j.anchor = t
		}
	}
}

// sweepCutoff returns the time before which finished records may be swept.
// It trusts the wall clock only as far as the journal's last change before
// this Client opened it plus the time this process has measured since on
// its monotonic clock: a clock set days ahead must not sweep away the
// records, and with them the name → key mappings, that a server still
// honours.
func (j *journal) sweepCutoff(now time.Time) time.Time {
	if !j.anchor.IsZero() {
		if trusted := j.anchor.Add(time.Since(j.opened)); trusted.Before(now) {
			now = trusted
		}
	}
	return now.Add(-j.retention)
}

// sweepEvery is how often finished records past retention are swept, so
// that a journal does not grow without bound in a process that never
// restarts.
const sweepEvery = time.Hour

// maybeSweep starts a sweep in the background if none ran in the last
// sweepEvery. One settling call an hour pays for starting a goroutine;
// none waits for the sweep.
func (j *journal) maybeSweep() {
	last := j.lastSweep.Load()
	now := time.Now()
	if last != 0 && now.Sub(time.Unix(0, last)) < sweepEvery || !j.lastSweep.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	j.sweeps.Add(1)
	go func() {
		defer j.sweeps.Done()
		n, err := j.store.Sweep(context.Background(), j.sweepCutoff(now))
		switch {
		case errors.Is(err, ErrClosed):
		case err != nil:
			j.log.Warn("idem: sweeping finished operations", "exception.message", err)
		default:
			j.log.Debug("idem: swept finished operations", "idem.swept", n)
		}
	}()
}

// newLease returns a lease for this process that starts at now.
func (j *journal) newLease(now time.Time) Lease {
	return Lease{Owner: j.owner, At: now, Until: now.Add(j.lease)}
}

// clockSkew is how far in the future a record's creation time may lie
// before idem takes it for a sign that the clock moved.
const clockSkew = time.Minute

// errFutureRecord says why a record dated in the future is not sent.
var errFutureRecord = errors.New("idem: record is dated in the future; the clock moved, so its age is unknown")

// tooOld returns why rec may not be sent again at now, or nil: it is older
// than the resend window, or dated in the future, which means the clock
// moved and its real age is unknown.
func (j *journal) tooOld(rec *Operation, now time.Time) error {
	switch {
	case rec.Created.After(now.Add(clockSkew)):
		return errFutureRecord
	case now.Sub(rec.Created) >= j.resendWindow:
		return ErrExpired
	}
	return nil
}

// armRenewal makes sure a renewal of the leases of the operations in
// flight is due within a third of a lease. The timer runs only while
// operations are in flight, so an idle Client has nothing running.
func (j *journal) armRenewal() {
	if j.renewArmed.Load() {
		return // the common case: a renewal is due already
	}
	j.renewMu.Lock()
	defer j.renewMu.Unlock()
	if j.renewArmed.Load() || j.renewStopped {
		return
	}
	j.renewArmed.Store(true)
	if j.renewT == nil {
		j.renewT = time.AfterFunc(j.lease/3, j.renewLeases)
	} else {
		j.renewT.Reset(j.lease / 3)
	}
}

// renewLeases renews the leases of the operations that have been in flight
// for a third of a lease or longer, and arms the next renewal while any is
// in flight.
func (j *journal) renewLeases() {
	// Disarm first: an operation that starts from here on arms the next
	// renewal itself, and one that started before is seen as busy below.
	j.renewMu.Lock()
	j.renewArmed.Store(false)
	j.renewMu.Unlock()
	now := time.Now()
	keys, busy := j.flight.runningSince(now.Add(-j.lease / 3))
	for _, key := range keys {
		err := j.store.Renew(context.Background(), key, j.newLease(now))
		if err != nil && !errors.Is(err, ErrLeaseLost) && !errors.Is(err, ErrClosed) {
			j.log.Warn("idem: renewing operation lease", "idem.key", key, "exception.message", err)
		}
	}
	if busy {
		j.armRenewal()
	}
}

// stopRenewal stops renewing leases, for Close.
func (j *journal) stopRenewal() {
	j.renewMu.Lock()
	defer j.renewMu.Unlock()
	j.renewStopped = true
	if j.renewT != nil {
		j.renewT.Stop()
	}
}
