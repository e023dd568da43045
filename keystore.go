package idem

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// State is where an operation stands in its lifecycle.
type State uint8

// The states of an operation. Only StatePending operations are resumed.
const (
	// StatePending means the operation was journaled and its outcome is not
	// known to the caller yet: it may be in flight, or the process died, or
	// the last attempt ended in an error without a response ("in doubt").
	StatePending State = 1
	// StateSucceeded means the caller received a 2xx or 3xx response.
	StateSucceeded State = 2
	// StateFailed means the caller received a final non-success response (a
	// permanent 4xx, or the last transient response when attempts ran out).
	StateFailed State = 3
	// StateExpired means the operation stayed pending past the resend window
	// and was given up without being sent again.
	StateExpired State = 4
)

// String returns the state's name in lower case.
func (s State) String() string {
	switch s {
	case StatePending:
		return "pending"
	case StateSucceeded:
		return "succeeded"
	case StateFailed:
		return "failed"
	case StateExpired:
		return "expired"
	}
	return "unknown"
}

// Finished reports whether s is a final state.
func (s State) Finished() bool { return s == StateSucceeded || s == StateFailed || s == StateExpired }

// Operation is one logical, keyed operation as the journal records it.
//
// While the operation is pending, Header and Body hold the replayable request
// (secret headers removed). Both are dropped when the operation finishes; only
// the key, name, fingerprint, state and outcome remain until retention ends.
type Operation struct {
	// Key is the Idempotency-Key sent with every attempt.
	Key string
	// Name is the durable operation name given with WithOperation, or "".
	Name string
	// Method and URL are those of the request.
	Method, URL string
	// Scope is the method and host the key is used against ("POST api.example.com").
	Scope string
	// Fingerprint is the SHA-256 over method, URL, body and the headers that
	// define the payload. A key is never sent with a different fingerprint.
	Fingerprint [32]byte
	// State is where the operation stands.
	State State
	// Attempts counts the requests sent under this key, over all processes.
	Attempts int
	// LastStatus is the HTTP status of the last response, or 0 if none.
	LastStatus int
	// LastError is the text of the last error without a response, or "".
	LastError string
	// Created and Updated are when the record was created and last changed.
	Created, Updated time.Time
	// Owner names the process that holds the operation while it is pending,
	// and LeaseUntil is when that claim lapses. A single-process journal
	// records them; a store shared by several replicas uses them to decide
	// who may resume an operation.
	Owner      string
	LeaseUntil time.Time
	// Header and Body are the replayable request while pending, nil after.
	Header http.Header
	Body   []byte
}

// Outcome is the result of one attempt or of a finished operation.
type Outcome struct {
	// State is the operation's state after this outcome. Attempt keeps it
	// StatePending; Finish requires a final state.
	State State
	// Status is the HTTP status received, or 0 when there was no response.
	Status int
	// Err is the text of the error when there was no response, or "".
	Err string
	// Attempts is added to the operation's attempt count by Finish: the
	// attempts that ended in this outcome and were not recorded with
	// Attempt (usually 1; 0 when the request was never sent). Attempt
	// ignores it and always adds one.
	Attempts int
}

// KeyStore is the journal behind a Client. It must be safe for concurrent use.
//
// Reserve and Reopen must not return before the record they write is
// durable: the transport sends nothing until they return. Attempt and Finish
// may return before their change is durable (it then rides the next commit);
// losing such a change in a crash only causes a resend that the server
// answers from its own idempotency store. Close makes every change durable.
//
// Reads (Get, Named, Pending) see every change whose call has returned,
// durable or not: a Finish followed by a Get returns the finished record.
type KeyStore interface {
	// Reserve creates the record op describes, unless one exists already.
	// If op.Name is not empty and a record with that name exists, that record
	// is the existing one; otherwise a record with op.Key is. Reserve returns
	// the record now in the journal and whether this call created it. An
	// existing record is returned unchanged. A store may keep op.Header and
	// op.Body, and the record returned for a created operation may share
	// them: the caller must change neither afterwards.
	Reserve(ctx context.Context, op Operation) (rec Operation, created bool, err error)

	// Reopen marks the finished record for key pending again, with the
	// replayable request in header and body, durably, and returns it.
	Reopen(ctx context.Context, key string, header http.Header, body []byte) (Operation, error)

	// Get returns the record for key, or an error matching ErrNotFound.
	Get(ctx context.Context, key string) (Operation, error)

	// Named returns the record for an operation name, or an error matching
	// ErrNotFound.
	Named(ctx context.Context, name string) (Operation, error)

	// Attempt records one attempt's outcome: it adds one to Attempts and
	// sets LastStatus and LastError. The operation stays pending.
	Attempt(ctx context.Context, key string, out Outcome) error

	// Finish moves the record for key to the final state in out, records its
	// status and error, and drops its replayable request.
	Finish(ctx context.Context, key string, out Outcome) error

	// Pending returns up to limit pending records, oldest first, starting
	// after the record whose key is after ("" starts at the oldest). The
	// records carry their replayable requests.
	Pending(ctx context.Context, after string, limit int) ([]Operation, error)

	// Sweep deletes finished records last updated before cutoff and returns
	// how many it deleted.
	Sweep(ctx context.Context, cutoff time.Time) (int, error)

	// Close makes every change durable and releases the journal.
	Close() error
}

// checkKey is the key check both stores make in Reserve.
func checkKey(key string) error {
	if key == "" || len(key) > maxKeyLen {
		return fmt.Errorf("%w: %q", ErrInvalidKey, key)
	}
	return nil
}

// newRecord fills in what Reserve sets on a new record: its times and, if
// unset, the pending state. Both stores use it.
func newRecord(op *Operation, now time.Time) {
	if op.Created.IsZero() {
		op.Created = now
	}
	op.Updated = now
	if op.State == 0 {
		op.State = StatePending
	}
}
