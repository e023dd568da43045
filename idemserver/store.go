package idemserver

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"
)

// A Store keeps the state of every scoped key the middleware has seen: in
// flight under a lease, or done with a stored response until it expires.
//
// The Store holds no clock: every call carries the time it is made at and
// the times it sets, so that a store shared by replicas (PostgreSQL) sees
// one time line per request and tests can move time without sleeping.
// Each method must be atomic with respect to the others for the same id; a
// SQL store does Begin as one conditional insert (INSERT ... ON CONFLICT
// DO UPDATE ... WHERE expires <= now) and Renew, Complete and Release as
// updates or deletes guarded by id, token and a live lease in the same
// statement.
//
// A store shared by replicas must judge leases by one clock: it may read
// the Now fields as the caller's view and use its own (the database's)
// clock for every comparison, keeping the durations the caller asked for
// (LeaseUntil minus Now). Such a store says so in its doc.
//
// Implementations must be safe for concurrent use and should pass
// storetest.Run.
type Store interface {
	// Begin claims id for a new request with the given payload
	// fingerprint. If id has no record, or its record expired (a lapsed
	// lease or a stored response past its retention, both at or before
	// b.Now), Begin writes an in-flight record with a fresh token that
	// holds the lease until b.LeaseUntil and returns StateAcquired and the
	// token. Otherwise it changes nothing and returns StateMismatch if the
	// record's fingerprint differs, else StateInFlight with the lease's
	// end, or StateDone with the stored response. The acquired record must
	// be durable when Begin returns, unless no other process can use the
	// store (a locked file): then it may live in memory, and a crash frees
	// it, since no handler of it can still run.
	Begin(ctx context.Context, b Begin) (Claim, error)
	// Renew moves the lease of the in-flight record id held under token to
	// until. It returns an error matching ErrLockLost if the record is
	// gone, done, held under another token, or its lease lapsed at or
	// before now.
	Renew(ctx context.Context, id, token string, now, until time.Time) error
	// Complete stores c.Response as the outcome of the in-flight record
	// c.ID held under c.Token and keeps it until c.Until. The check and
	// the change are one atomic step: it returns an error matching
	// ErrLockLost, and changes nothing, if the record is gone, done, held
	// under another token, or its lease lapsed at or before c.Now. The
	// record must be durable when Complete returns. A response with
	// NotKept set is stored as such, without header or body.
	Complete(ctx context.Context, c Completion) error
	// Release deletes the in-flight record id held under token, so that the
	// next request with its key runs. It returns an error matching
	// ErrLockLost if the record is gone, done or held under another token.
	Release(ctx context.Context, id, token string) error
	// Sweep deletes every record that expired at or before now and returns
	// how many it deleted.
	Sweep(ctx context.Context, now time.Time) (int, error)
	// Close releases the store's resources. Calls after Close return an
	// error matching ErrClosed.
	Close() error
}

// A LocalStore is a Store whose keys in flight live in this process only
// (MemoryStore; BoltStore, whose file one process locks), so that it can
// hold a key for as long as the request holding it runs, whatever the
// clock says. A lease only matters to a store shared across processes: in
// one process nothing but the running handler's own request can hold its
// key, and a process paused longer than its lease (a GC pause, SIGSTOP, a
// migrated VM, a throttled cgroup) must not let a second request run the
// same handler when it goes on.
//
// The middleware claims the keys of a LocalStore with BeginHeld, does not
// fence its handlers (their keys cannot be lost), and calls Unhold when a
// request ends, so that a key whose answer could not be stored is freed
// by its lease as in any store. A wrapper that embeds the Store interface
// is not a LocalStore: its keys are judged by their leases.
type LocalStore interface {
	Store
	// BeginHeld is Begin, except that the record it acquires is held:
	// until Complete or Release ends it, or Unhold lets it go, Begin,
	// Renew, Complete and Sweep treat it as live whatever their now.
	BeginHeld(ctx context.Context, b Begin) (Claim, error)
	// Unhold ends the hold of the in-flight record id held under token:
	// from then on its lease counts as any record's. It does nothing for
	// a record gone, done, or held under another token.
	Unhold(id, token string)
}

// Begin holds the arguments of Store.Begin.
type Begin struct {
	// ID names the scoped key: the middleware passes a hash of the
	// principal, method, path and key, at most 64 bytes of ASCII.
	ID string
	// Fingerprint identifies the payload; at most 64 bytes of ASCII, empty
	// for webhook events, which are deduplicated by id alone.
	Fingerprint string
	// Now is the time of the request; records that expired at or before it
	// are treated as absent.
	Now time.Time
	// LeaseUntil is when the lease of an acquired record ends.
	LeaseUntil time.Time
}

// Completion holds the arguments of Store.Complete.
type Completion struct {
	// ID and Token name the in-flight record and the caller's hold on it.
	ID, Token string
	// Response is the outcome to store; it must not be nil.
	Response *Response
	// Now is the time of the completion: a lease that ended at or before
	// it is lost.
	Now time.Time
	// Until is when the stored response expires.
	Until time.Time
}

// State is the outcome of Store.Begin.
type State uint8

// The outcomes of Store.Begin.
const (
	// StateAcquired means the caller holds a new in-flight record and must
	// run the handler, then Complete or Release it.
	StateAcquired State = iota + 1
	// StateInFlight means another request holds the key under a live lease.
	StateInFlight
	// StateDone means the key has a stored response, in Claim.Response.
	StateDone
	// StateMismatch means the key is held or done with another payload.
	StateMismatch
)

// String returns the state's name, such as "in-flight".
func (s State) String() string {
	switch s {
	case StateAcquired:
		return "acquired"
	case StateInFlight:
		return "in-flight"
	case StateDone:
		return "done"
	case StateMismatch:
		return "mismatch"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// Claim is the result of Store.Begin.
type Claim struct {
	// State says what Begin found or did.
	State State
	// Token identifies the caller's hold on an acquired record; Renew,
	// Complete and Release require it. Set for StateAcquired only.
	Token string
	// LeaseUntil is when the holder's lease ends: for StateAcquired the
	// requested end, for StateInFlight the current holder's.
	LeaseUntil time.Time
	// Response is the stored response, for StateDone only. It belongs to
	// the caller.
	Response *Response
}

// Response is a stored HTTP response: what a replay sends.
type Response struct {
	// Status is the HTTP status code.
	Status int
	// Header holds the replayed headers only (see WithReplayHeaders), as
	// they stood when the status was written, and the trailers sent after
	// the body under their http.TrailerPrefix names ("Trailer:X-Checksum"),
	// with the Trailer header that declared them: a replay sets them as
	// net/http's ResponseWriter takes trailers, so they go out as
	// trailers again.
	Header http.Header
	// Body is the whole response body.
	Body []byte
	// NotKept marks the record of a request whose handler ran and whose
	// answer went to the client but could not be kept: a body over
	// WithMaxResponseBytes, a hijacked connection, a 101 Switching
	// Protocols, a stream cut off after its first flush. Status is the status sent (0 if unknown); Header
	// and Body are empty. A retry is answered with a ProblemNotKept
	// document, never by running the handler again.
	NotKept bool
}

// Errors of stores and of the middleware's setup. Each is returned wrapped;
// match with errors.Is.
//
// A store whose file or database cannot be used returns the errors the
// client's journal returns, one word for one thing on both sides:
// idem.ErrJournalLocked (another process or handle holds the file),
// idem.ErrJournalCorrupt (a truncated, damaged, emptied or foreign file,
// or a record that fails its checksum: never replayed) and
// idem.ErrJournalWrite (a change that could not be made durable, or a
// store that cannot be reached).
var (
	// ErrLockLost is returned by Renew, Complete and Release when the
	// caller no longer holds the record: its lease lapsed and another
	// request took it, or it was swept.
	ErrLockLost = errors.New("idemserver: lock on the key was lost")
	// ErrClosed is returned by a store after Close.
	ErrClosed = errors.New("idemserver: store closed")
	// ErrRolledBack is returned by RequestTx.Commit when nothing was
	// committed, for certain: the database refused the commit (a deferred
	// constraint, a serialization failure) or the transaction failed
	// earlier. The handler's writes and the answer are both gone.
	ErrRolledBack = errors.New("idemserver: request transaction rolled back")
	// ErrTxAborted is returned by RequestTx.Commit, with ErrRolledBack,
	// when a statement of the handler failed, aborting the request's
	// transaction, and the handler answered with a status below 400
	// anyway: its writes cannot commit, so the answer would claim work
	// that was not done. The middleware answers 500 ProblemTxAborted and
	// releases the key. (A 4xx answer over an aborted transaction is the
	// common "catch the unique violation, answer 409" and is stored: see
	// pgstore.Tx.)
	ErrTxAborted = errors.New("idemserver: the handler answered success over an aborted transaction")
)
