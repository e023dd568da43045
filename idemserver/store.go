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
// updates or deletes guarded by id and token.
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
	// be durable when Begin returns.
	Begin(ctx context.Context, b Begin) (Claim, error)
	// Renew moves the lease of the in-flight record id held under token to
	// until. It returns an error matching ErrLockLost if the record is
	// gone, done or held under another token.
	Renew(ctx context.Context, id, token string, until time.Time) error
	// Complete stores resp as the outcome of the in-flight record id held
	// under token and keeps it until the time until. The record must be
	// durable when Complete returns. It returns an error matching
	// ErrLockLost if the record is gone, done or held under another token.
	Complete(ctx context.Context, id, token string, resp *Response, until time.Time) error
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
	// Header holds the replayed headers only (see WithReplayHeaders).
	Header http.Header
	// Body is the whole response body.
	Body []byte
}

// Errors of stores and of the middleware's setup. Each is returned wrapped;
// match with errors.Is.
var (
	// ErrLockLost is returned by Renew, Complete and Release when the
	// caller no longer holds the record: its lease lapsed and another
	// request took it, or it was swept.
	ErrLockLost = errors.New("idemserver: lock on the key was lost")
	// ErrClosed is returned by a store after Close.
	ErrClosed = errors.New("idemserver: store closed")
	// ErrStoreLocked is returned by OpenBoltStore when another process or
	// handle holds the file.
	ErrStoreLocked = errors.New("idemserver: store file is locked by another process or handle")
	// ErrStoreCorrupt is returned when the store file or a record in it
	// cannot be read: a truncated, damaged or foreign file.
	ErrStoreCorrupt = errors.New("idemserver: store is corrupt")
	// ErrStoreWrite is returned when a change could not be made durable
	// (a full disk, a read-only file, an I/O error) or the store could not
	// be reached (a database that is down).
	ErrStoreWrite = errors.New("idemserver: store write failed")
)
