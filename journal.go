package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"
)

// journal is what an operation needs of its surroundings: the store, this
// process's name and lease, the in-flight registry and the index of recent
// calls a resend may belong to. Transport and Resume share one.
type journal struct {
	store     KeyStore
	owner     string
	keyHeader string // what Operation.KeyHeader records
	// headerNamed says the application named keyHeader (WithKeyHeader,
	// WithProvider): a record without a key header of its own is sent
	// under it; otherwise it is refused (errUnknownKeyHeader).
	headerNamed bool
	newKey      func() (string, error) // makes a key in the provider's format
	// refused, if set, is why this Client may not use the journal (its
	// policy conflicts with the journal's): every call fails with it.
	refused      error
	lease        time.Duration
	resendWindow time.Duration
	retention    time.Duration
	log          *slog.Logger

	flight inflight
	recent recentCalls
	last   lastRequest
	calls  calls

	lastSweep atomic.Int64 // when finished records were last swept (Unix ns)
	// sweeps counts the sweeps and clock measurements running, for
	// Shutdown; none starts (background) once bgClosed is set.
	sweeps   sync.WaitGroup
	bgMu     sync.Mutex
	bgClosed bool

	// clock is the store's clock, if it has one; offset is what to add to
	// the local clock to read it (ns), measured at measured (local Unix ns).
	clock     Clock
	offset    atomic.Int64
	measured  atomic.Int64
	measuring atomic.Bool
	// anchor is when the journal last changed before this Client opened
	// it, if the store says, and opened is when that was read (with its
	// monotonic reading).
	anchor, opened time.Time

	renewMu      sync.Mutex
	renewT       *time.Timer
	renewArmed   atomic.Bool // read without renewMu on the hot path, written under it
	renewStopped bool
}

// clockRefresh is how often the offset to a store's Clock is measured
// again, and clockTimeout bounds one measurement.
const (
	clockRefresh = 5 * time.Minute
	clockTimeout = 5 * time.Second
)

// now returns the time the journal passes to its store: the local clock,
// plus the offset to the store's Clock if it has one. A measurement older
// than clockRefresh starts a new one in the background.
func (j *journal) now() time.Time {
	t := time.Now()
	if j.clock == nil {
		return t
	}
	if t.UnixNano()-j.measured.Load() >= int64(clockRefresh) && j.measuring.CompareAndSwap(false, true) {
		started := j.background(func() {
			defer j.measuring.Store(false)
			j.measureClock()
		})
		if !started {
			j.measuring.Store(false)
		}
	}
	return t.Add(time.Duration(j.offset.Load()))
}

// measureClock measures the offset between the local clock and the
// store's, taking the store's reading as made in the middle of the call.
// A failed measurement keeps the last offset.
func (j *journal) measureClock() {
	ctx, cancel := context.WithTimeout(context.Background(), clockTimeout)
	defer cancel()
	before := time.Now()
	st, err := j.clock.Now(ctx)
	after := time.Now()
	j.measured.Store(after.UnixNano())
	if err != nil {
		if !errors.Is(err, ErrClosed) {
			j.log.Warn("idem: reading the store's clock", "exception.message", err)
		}
		return
	}
	j.offset.Store(int64(st.Sub(before.Add(after.Sub(before) / 2))))
}

// stamp fills in what the journal sets on a record it reserves: its
// state, its times and its lease, from one reading of the clock.
func (j *journal) stamp(op *Operation) {
	now := j.now()
	op.State, op.Created, op.Updated = StatePending, now, now
	op.Owner, op.LeaseUntil = j.owner, now.Add(j.lease)
	op.KeyHeader = j.keyHeader
}

// errUnknownKeyHeader says why a record without a key header of its own
// (written before Operation.KeyHeader existed) is not sent by a Client
// left at the default header: its header is unknown, and a guess would
// send the key where the provider does not read it (a new operation).
var errUnknownKeyHeader = errors.New("idem: the record was journaled before records kept their key header, and this Client names none: " +
	"open it with the header it was sent with (WithKeyHeader or WithProvider) to send it again")

// sendHeader returns the header rec's key travels in: the one it was
// journaled with, or for a record from before records kept one, the
// header the application named; an error when it named none.
func (j *journal) sendHeader(rec *Operation) (string, error) {
	switch {
	case rec.KeyHeader != "":
		return http.CanonicalHeaderKey(rec.KeyHeader), nil
	case j.headerNamed:
		return j.keyHeader, nil
	}
	return "", errUnknownKeyHeader
}

// checkReserve returns why op may not be reserved, or nil. It is the
// journal's check of every record it passes to Reserve, which no store
// repeats.
func checkReserve(op *Operation) error {
	return CheckKey(op.Key)
}

// maxErrText bounds the error text a record keeps (LastError): a longer
// text is cut at a character boundary and ends with "…".
const maxErrText = 2048

// recordedText returns s as a record keeps an error text: its URLs
// redacted (RedactText: a base transport's error may quote the request's
// URL with its query), valid UTF-8 (invalid bytes become U+FFFD), without
// NUL bytes, and at most maxErrText bytes long. Every store then holds the
// same text, whatever its format.
func recordedText(s string) string {
	s = secrets.redactText(s)
	if len(s) <= maxErrText && utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s // the common case costs no allocation
	}
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
	if len(s) <= maxErrText {
		return s
	}
	cut := maxErrText - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// finish writes the outcome o of rec, which this journal holds pending:
// the one place that decides what a finished record keeps. The store
// writes o as it is given.
func (j *journal) finish(ctx context.Context, rec *Operation, o Outcome) error {
	if !o.State.Finished() {
		return fmt.Errorf("idem: finish %q: state %s is not final", rec.Key, o.State)
	}
	o.Sent = max(o.Sent, -1) // -1 withdraws a start it counted (Outcome.Sent)
	o.URL = TrimQuery(rec.URL)
	o.Err = recordedText(o.Err)
	o.Owner = j.owner // only the holder's outcome is written (KeyStore.Finish)
	return j.store.Finish(ctx, rec.Key, o)
}

// anchorClock measures the offset to the store's clock, if it has one,
// and reads the store's last change, which bounds how far the sweeps of
// this Client trust the clock.
func (j *journal) anchorClock() {
	if c, ok := j.store.(Clock); ok {
		j.clock = c
		j.measureClock()
	}
	j.opened = time.Now()
	if lc, ok := j.store.(LastChanger); ok {
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

// background runs fn on a goroutine of its own, counted in j.sweeps, and
// reports whether it did: once Shutdown waits for that work
// (closeBackground), nothing more starts (a call that outlived Shutdown
// still reads the clock, and would start a measurement: an Add during
// the WaitGroup's Wait, which panics).
func (j *journal) background(fn func()) bool {
	j.bgMu.Lock()
	defer j.bgMu.Unlock()
	if j.bgClosed {
		return false
	}
	j.sweeps.Add(1)
	go func() {
		defer j.sweeps.Done()
		fn()
	}()
	return true
}

// closeBackground stops background work from starting, for Shutdown,
// which then waits for what runs (j.sweeps).
func (j *journal) closeBackground() {
	j.bgMu.Lock()
	j.bgClosed = true
	j.bgMu.Unlock()
}

// maybeSweep starts a sweep in the background if none ran in the last
// sweepEvery. One settling call an hour pays for starting a goroutine;
// none waits for the sweep.
func (j *journal) maybeSweep() {
	last := j.lastSweep.Load()
	now := time.Now()
	if last != 0 && now.Sub(time.Unix(0, last)) < sweepEvery || !j.lastSweep.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	j.background(func() {
		n, err := j.store.Sweep(context.Background(), j.sweepCutoff(j.now()))
		switch {
		case errors.Is(err, ErrClosed):
		case err != nil:
			j.log.Warn("idem: sweeping finished operations", "exception.message", err)
		default:
			j.log.Debug("idem: swept finished operations", "idem.swept", n)
		}
	})
}

// newLease returns a lease for this process that starts at now.
func (j *journal) newLease(now time.Time) Lease {
	return Lease{Owner: j.owner, At: now, Until: now.Add(j.lease)}
}

// claimPending claims, for Resume, up to n pending operations with keys
// after after that this process owns or whose lease lapsed, under a new
// lease.
func (j *journal) claimPending(ctx context.Context, after string, n int) ([]Operation, error) {
	return j.store.Claim(ctx, j.newLease(j.now()), after, n)
}

// releaseClaim ends the lease Claim gave this Client on op, which Resume
// does not send, so that no one waits for it: a caller's re-drive, or
// another replica's Resume, may take it at once. An operation in flight
// in this process keeps its caller's lease.
func (j *journal) releaseClaim(ctx context.Context, op Operation) {
	ids := flightIDs(op.Key, op.Name)
	if wait, _ := j.flight.acquire(&ids); wait != nil {
		return
	}
	defer j.flight.release(ids)
	now := j.now()
	if err := j.store.Renew(ctx, op.Key, Lease{Owner: j.owner, At: now, Until: now}); err != nil && !errors.Is(err, ErrLeaseLost) {
		j.log.Warn("idem: releasing a claimed operation", "idem.key", op.Key, "exception.message", err)
	}
}

// clockSkew is how far in the future a record's creation time may lie
// before idem takes it for a sign that the clock moved.
const clockSkew = time.Minute

// errExpiredFinal says why an expired operation is not sent again, even
// within the resend window: expiry is final.
var errExpiredFinal = errors.New("idem: the operation was expired: it is never sent again; reconcile it with the server by its key")

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
	keys, busy := j.flight.runningSince(time.Now().Add(-j.lease / 3))
	now := j.now()
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

// unjournaled is a store's error about a key that was never journaled: its
// text does not show the key, which no caller could use, while errors.Is
// and errors.As still see the error.
type unjournaled struct {
	err error
	key string
}

func (u unjournaled) Error() string {
	if u.key == "" {
		return u.err.Error()
	}
	return strings.ReplaceAll(u.err.Error(), u.key, "(unjournaled key)")
}

func (u unjournaled) Unwrap() error { return u.err }

// journalCause returns the sentinel a store error matches, for Error.Cause.
func journalCause(err error) error {
	for _, s := range []error{ErrInvalidKey, ErrClosed, ErrOutcomeUnknown, ErrJournalCorrupt, ErrRecordVersion, ErrJournalLocked, ErrJournalWrite, ErrNotFound} {
		if errors.Is(err, s) {
			return s
		}
	}
	return ErrJournalWrite
}

// journalFailed reports a journal write that failed: one Error line in
// the log and the JournalError hooks.
func (j *journal) journalFailed(ctx context.Context, hs hookSet, op OperationInfo, write string, err error) {
	j.log.Error("idem: journal write failed", "idem.key", op.Key, "idem.operation", op.Name,
		"idem.journal.write", write, "exception.message", err)
	if hs.any() {
		hs.journalError(JournalErrorInfo{OperationInfo: op, Context: ctx, Write: write, Err: err})
	}
}

// journalFault reports whether err, from a reservation, says the journal
// could not be read or written (rather than, say, a key in use).
func journalFault(err error) bool {
	return errors.Is(err, ErrJournalWrite) || errors.Is(err, ErrJournalCorrupt) || errors.Is(err, ErrRecordVersion) || errors.Is(err, ErrOutcomeUnknown)
}

// reserveFailed reports a reservation that failed in the journal, with
// the key the error carries (the journal's, if it had one).
func (j *journal) reserveFailed(ctx context.Context, hs hookSet, op *Operation, err error) {
	info := OperationInfo{Name: op.Name, Method: op.Method, URL: op.URL, State: StatePending}
	var ie *Error
	if errors.As(err, &ie) {
		info.Key = ie.Key
	}
	j.journalFailed(ctx, hs, info, WriteReserve, err)
}

// logResumed writes the Debug line of an operation Resume took: sent (the
// status it got, or err), or not sent (err says why).
func (j *journal) logResumed(rec *Operation, sent bool, status int, err error) {
	if !j.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	attrs := []any{"idem.key", rec.Key, "idem.operation", rec.Name, "idem.sent", sent}
	if status != 0 {
		attrs = append(attrs, "http.response.status_code", status)
	}
	if err != nil {
		attrs = append(attrs, "exception.message", errText(err))
	}
	j.log.Debug("idem: resume took operation", attrs...)
}

// policyTimeout bounds reading and writing the policy at New.
const policyTimeout = 10 * time.Second

// adoptPolicy checks the Client's policy against the one the store holds,
// if it is a PolicyStore, and stores the Client's. A conflict is returned
// matching ErrPolicyConflict; any other error is the store's.
func (j *journal) adoptPolicy(p Policy) error {
	ps, ok := j.store.(PolicyStore)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), policyTimeout)
	defer cancel()
	stored, err := ps.Policy(ctx)
	if err != nil {
		return fmt.Errorf("idem: reading the journal's policy: %w", err)
	}
	if err := stored.Allows(p); err != nil {
		return err
	}
	if stored == p {
		return nil
	}
	if err := ps.SetPolicy(ctx, p); err != nil {
		return fmt.Errorf("idem: writing the journal's policy: %w", err)
	}
	return nil
}

// recordedReason returns s as an attempt's record keeps its reason
// (Attempt.Reason): valid UTF-8 without control characters, any URL in it
// without its query and fragment, at most MaxReason bytes. A reason
// comes from idem's classifier or the application's, never from a header
// value; cutting URL queries keeps a classifier that quotes an error from
// journaling a secret query parameter.
func recordedReason(s string) string {
	clean := len(s) <= MaxReason && utf8.ValidString(s) && !strings.Contains(s, "://")
	for i := 0; clean && i < len(s); i++ {
		clean = s[i] >= 0x20 && s[i] != 0x7f
	}
	if clean {
		return s // the classifier's own reasons cost nothing
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	if strings.Contains(s, "://") {
		words := strings.Fields(s)
		for i, w := range words {
			if strings.Contains(w, "://") {
				words[i] = TrimQuery(w)
			}
		}
		s = strings.Join(words, " ")
	}
	if len(s) <= MaxReason {
		return s
	}
	cut := MaxReason - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
