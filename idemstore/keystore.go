package idemstore

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/idemgo/idem/internal/keys"
)

// State is where an operation stands in its lifecycle.
type State uint8

// The states of an operation. Only StatePending operations are resumed.
const (
	// StatePending means the operation was journaled and its outcome is not
	// known to the caller yet: it may be in flight, or the process died, or
	// the last attempt ended in an error without a response ("in doubt").
	StatePending State = 1
	// StateSucceeded means the caller received a 2xx or 3xx response, or a
	// 409 saying the server performed the request with a 2xx it did not
	// keep (idemserver's ProblemNotKept; LastError says so).
	StateSucceeded State = 2
	// StateFailed means the caller received a final non-success response (a
	// permanent 4xx, or the last transient response when attempts ran out,
	// or a 409 saying the server performed the request and did not keep an
	// answer that was not a 2xx, LastError saying so), or the request was
	// never sent.
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
// (credentials removed). Both are dropped when the operation finishes; only
// the key, name, fingerprint, state, outcome, attempt history and trace
// context remain until retention ends.
type Operation struct {
	// Key is the Idempotency-Key sent with every attempt.
	Key string
	// KeyHeader is the request header the key travels in, as the
	// application named it when the operation was journaled (it may change
	// between releases); Resume sends the key in it. It is "" only in
	// records written before it existed: Resume then uses the Client's
	// key header (WithKeyHeader).
	KeyHeader string
	// Name is the durable operation name given with WithOperation, or "".
	Name string
	// Method and URL are those of the request. The URL carries no user info
	// and no secret query parameters; a finished record keeps neither query
	// nor fragment (TrimQuery).
	Method, URL string
	// Host is the request's Host header when it differs from the URL's
	// host (a virtual host), or "".
	Host string
	// Fingerprint is the SHA-256 over method, URL, body and the headers that
	// define the payload. A key is never sent with a different fingerprint.
	Fingerprint [32]byte
	// State is where the operation stands.
	State State
	// Attempts counts the requests written under this key, over all
	// processes. An attempt is counted when it starts, before it is sent
	// (the first in the reservation, a later one in the mark before it),
	// so that a crash while it is on the wire cannot hide it; one that
	// then wrote nothing is withdrawn by the next mark or the outcome. A
	// pending record may so count one request more than was written: the
	// one under way, or an in-doubt operation's last attempt that wrote
	// nothing.
	Attempts int
	// LastStatus is the HTTP status of the last response, or 0 if none;
	// for a request performed without its answer kept, the status the
	// server first sent (409 when it did not say).
	LastStatus int
	// LastError is the text of the last error without a response, or "";
	// for a request performed without its answer kept, what Outcome.Err
	// says.
	LastError string
	// Created is when the operation was first journaled; Updated is when
	// its record last changed.
	Created, Updated time.Time
	// Owner names the process that holds the operation's lease while it is
	// pending, and LeaseUntil is when that lease lapses. Only the owner, or
	// anyone after the lease lapsed, may send the operation.
	Owner      string
	LeaseUntil time.Time
	// Redacted reports that credentials (secret headers, the URL's user
	// info, secret query parameters) were removed before journaling: a
	// resend needs WithResumePrepare to add them back.
	Redacted bool
	// Unreplayable reports that the body was not journaled (it was over the
	// body limit and the Client allows sending such bodies): the operation
	// keeps its key and fingerprint, but Resume cannot send it again.
	Unreplayable bool
	// Header and Body are the replayable request while pending, nil after.
	Header http.Header
	Body   []byte
	// History is the attempts KeyStore.Attempt recorded for the operation,
	// oldest first, at most MaxHistory of them (the oldest go first): the
	// attempts that were retried or left it in doubt. A one-attempt
	// success records none. Finish and Acquire keep it; records written
	// before it existed read with none.
	History []Attempt
	// Trace is the W3C traceparent of the context the operation was
	// journaled under (Hooks.TraceContext), or "": what a resend links its
	// spans to. It is not a secret. Acquire and Finish keep it.
	Trace string
}

// Lease is a claim on a pending operation: Owner may send it until Until.
// At is when the claim is made; another owner's lease that ends at or
// before At has lapsed and may be taken over.
type Lease struct {
	Owner     string
	At, Until time.Time
}

// BlockedBy reports whether a pending record leased to owner until until
// keeps l out: it is another owner's lease that has not lapsed at l.At.
// It is the lease test of Acquire and Claim, for stores written in Go.
func (l Lease) BlockedBy(owner string, until time.Time) bool {
	return owner != "" && owner != l.Owner && until.After(l.At)
}

// Request is the replayable request of a pending record: what Acquire
// reopens a finished record with.
type Request struct {
	// URL is the request's URL as the journal reserved it, query
	// included: the finished record kept it without (Outcome.URL).
	URL string
	// Header and Body are the journaled header and body.
	Header http.Header
	Body   []byte
}

// Attempt is what KeyStore.Attempt records of requests that were written
// while the operation stays pending.
type Attempt struct {
	// Sent counts the requests the mark adds to Attempts. Since the
	// journal counts an attempt when it starts (Operation.Attempts), a
	// mark made before a retry counts the attempt that failed beyond its
	// first request (net/http may write a request twice on a reused
	// connection) and the retry about to start: usually 1. The mark of an
	// operation left in doubt counts only what its last attempt wrote
	// beyond its first request: usually 0. It is never negative.
	Sent int
	// Status is the HTTP status of the last response, or 0 when none came.
	Status int
	// Err is the text of the error when no response came, or "".
	Err string
	// Reason is why the attempt did not end the operation, as idem's retry
	// classifier put it: for example "503", "409 in progress",
	// "connection closed", "timeout". The journal passes it as valid UTF-8
	// without control characters, at most MaxReason bytes long, with no URL
	// query in it.
	Reason string
	// At is when the mark is made; the store sets Updated to it.
	At time.Time
	// Owner is the lease owner the mark is made for (the journal's own,
	// Operation.Owner of the record it holds): the store records the
	// attempt only on a pending record Owner holds (KeyStore.Attempt). ""
	// marks unconditionally, as stores did before marks carried an owner:
	// for tools and tests that mark a record outside any lease; the
	// journal always sets it. It is not kept in History.
	Owner string
}

// Outcome is what KeyStore.Finish records of a finished operation.
type Outcome struct {
	// State is the final state.
	State State
	// Status is the HTTP status of the last response, or 0 when none came.
	Status int
	// Err is the text of the error when there was no response, or "".
	// For a request the server performed without keeping its answer (a
	// 409 idemserver ProblemNotKept), it says so, with any State: "performed
	// by server, answer not kept (original status 201)", Status being the
	// original status (409 when unknown).
	Err string
	// Sent counts the requests written that no Attempt recorded (0 when the
	// last request was recorded, or nothing was sent). It is -1 when the
	// journal withdraws the last attempt, which it counted as started
	// (in the reservation, or the mark before it) and which then wrote
	// nothing (a refused connection): Attempts never goes below zero, since
	// the journal withdraws only what it counted. A store adds it to
	// Attempts as it is.
	Sent int
	// URL is the URL the finished record keeps: the journal passes the
	// record's URL without its query and fragment (TrimQuery), which may
	// hold secrets or personal data.
	URL string
	// At is when the mark is made; the store sets Updated to it.
	At time.Time
	// Owner is the lease owner the outcome is written for, as
	// Attempt.Owner: the store writes it only on a pending record Owner
	// holds (KeyStore.Finish), so a late outcome from a process that lost
	// the record never overwrites another's. "" writes unconditionally;
	// the journal always sets it.
	Owner string
}

// TrimQuery returns u without its query and fragment: the URL a finished
// record keeps (Outcome.URL), and the one tools show.
func TrimQuery(u string) string {
	if i := strings.IndexAny(u, "?#"); i >= 0 {
		return u[:i]
	}
	return u
}

// KeyStore is the journal behind a Client: the memory store, the bbolt
// journal, the PostgreSQL store of package pgstore, or a user's own. It must
// be safe for concurrent use. Package storetest checks an implementation
// against this contract.
//
// A store is thin: it keeps records as it is told and does only what must
// be atomic. Every rule about a record lives in the journal (the Client),
// which passes its result. It validates keys (CheckKey) and names before
// Reserve. It sets every field of the record it reserves (state, times,
// owner and lease, key header, the request with its credentials removed).
// It computes what a finished record keeps (Outcome: the final state, the
// URL without its query and fragment). It passes error text (Attempt.Err,
// Outcome.Err) as valid UTF-8 without NUL bytes, at most 2 KiB long, an
// attempt's reason (Attempt.Reason) at most MaxReason bytes, and a trace
// context (Operation.Trace) only as a well-formed traceparent. And it
// decides every transition: it records attempts and outcomes only for
// pending operations it holds, passes Finish only final states and never a
// negative count, and reopens a finished record with the request it
// reserved (Request). A store repeats none of these rules and defaults
// nothing. The rules that stay in a store are those that must be decided
// on the record as it is at the moment of the write, where no caller can
// decide them without a race:
//
//   - Reserve inserts only if no record has the name (first) or the key;
//   - Acquire leases only if no other owner's lease is live at Lease.At,
//     and reopens a finished record with the request it is given while a
//     pending one keeps its own;
//   - Renew changes the lease only of a pending record Lease.Owner holds;
//   - Claim leases only pending records whose lease is free, in the same
//     step as it selects them;
//   - Sweep deletes only finished records last updated before the cutoff;
//   - Attempt appends to the record's History and trims it to MaxHistory
//     in the same change as it counts the attempt;
//   - Attempt and Finish change only a pending record whose Owner is the
//     mark's (Attempt.Owner, Outcome.Owner): a mark from an owner that
//     lost the record (another owner claimed or acquired it, or it was
//     finished, or reopened by someone else) changes nothing. The journal
//     cannot decide it: it marks asynchronously, and may have stalled past
//     its lease while another process took the operation over.
//
// A store may refuse what its format cannot hold, and says so on its type
// (the bbolt journal refuses a key ending in a NUL byte; PostgreSQL text
// that is not UTF-8).
//
// A mark that changes nothing because its owner lost the record is not an
// error: Attempt and Finish return nil for it (they may return before the
// store knew), and a store may count or log it (pgstore logs it).
//
// Reserve, Acquire and Renew must not return before their change is durable:
// the transport sends nothing until they return. Attempt and Finish may
// return before their change is durable (it then rides a later commit), but
// a change they accepted must not be dropped: a failed commit is retried,
// and Close makes every accepted change durable or returns an error.
//
// Reads (Get, Pending) see every change whose call has returned, durable or
// not: a Finish followed by a Get returns the finished record.
//
// Records are ordered by key (for UUIDv7 keys, the order they were made).
//
// A store reads no clock: every time it records is given by the caller
// (Operation.Created and Updated to Reserve, Lease.At to Acquire and Renew,
// Attempt.At and Outcome.At), and every time it compares is given too
// (Lease.At, Sweep's cutoff). The Client computes them, from the store's
// own clock when the store is a Clock. A store shared by processes may
// judge leases by its own clock instead, and says so on its type (pgstore
// takes the database's clock as the now of every lease change, and keeps
// Until − At from then).
//
// A store may implement the optional capabilities LastChanger, Inspector,
// Clock and PolicyStore; each says what the Client does without it.
//
// Every error about the journal itself matches one of ErrJournalCorrupt,
// ErrJournalWrite, ErrRecordVersion or ErrClosed; a missing record matches
// ErrNotFound.
type KeyStore interface {
	// Reserve creates the record op describes, unless one exists already.
	// If op.Name is not empty and a record with that name exists, that
	// record is the existing one; otherwise a record with op.Key is.
	// Reserve returns the record now in the journal and whether this call
	// created it. An existing record is returned unchanged, with its
	// replayable request if it is pending. A store may keep op.Header and
	// op.Body, and the record returned for a created operation may share
	// them: the caller must change neither afterwards. The store keeps
	// every field as given, State, Created, Updated, Header and Body
	// included: the journal has validated and completed op.
	Reserve(ctx context.Context, op Operation) (rec Operation, created bool, err error)

	// Acquire gives the record for key to l.Owner until l.Until and returns
	// it, with its replayable request. If the record is pending under
	// another owner's lease that has not lapsed at l.At (Lease.BlockedBy),
	// Acquire changes nothing and returns an error matching ErrInProgress.
	// If the record is finished, it is made pending again with req as its
	// replayable request (URL, Header and Body); a pending record keeps
	// its own. Updated becomes l.At.
	Acquire(ctx context.Context, key string, l Lease, req Request) (Operation, error)

	// Renew extends l.Owner's lease on the pending record for key to
	// l.Until (which may be l.At, releasing it). It returns an error
	// matching ErrLeaseLost if the record is not pending or another owner
	// holds it, and one matching ErrNotFound or ErrLeaseLost if there is
	// no record for key. It changes only the lease: Updated stays.
	Renew(ctx context.Context, key string, l Lease) error

	// Get returns the record for key, or an error matching ErrNotFound.
	Get(ctx context.Context, key string) (Operation, error)

	// Attempt records requests written under key: it adds a.Sent to
	// Attempts, sets LastStatus, LastError and Updated (to a.At), and
	// appends a to History, dropping the oldest entries beyond
	// MaxHistory (AppendHistory), all in one atomic change; it changes
	// nothing else. It does so only if the record is pending and its
	// Owner is a.Owner (whether or not the lease has lapsed, as long as no
	// one took it); otherwise it changes nothing and returns nil. An empty
	// a.Owner skips that test. The journal calls it for a pending record
	// it holds, with a.Err and a.Reason already bounded and cleaned (a
	// store keeps them as given). Finish, Acquire and Renew keep History
	// as it is.
	Attempt(ctx context.Context, key string, a Attempt) error

	// Finish writes the outcome o of the record for key: State becomes
	// o.State, Attempts grows by o.Sent, LastStatus, LastError, URL and
	// Updated become o.Status, o.Err, o.URL and o.At; the replayable
	// request is dropped and the lease ends. It does so only if the
	// record is pending and its Owner is o.Owner (as Attempt); otherwise
	// it changes nothing and returns nil, so a finished record keeps its
	// outcome and a record another owner took keeps its course. An empty
	// o.Owner skips that test. It writes what it is given: the journal
	// calls it for a pending record it holds, with a final state and the
	// URL the finished record keeps.
	Finish(ctx context.Context, key string, o Outcome) error

	// Pending returns up to limit pending records with keys after after
	// ("" starts at the first), in key order, with their replayable
	// requests. It changes nothing. A record that cannot be read is
	// returned with only its Key, State 0 and LastError saying why set,
	// and an error matching ErrJournalCorrupt or ErrRecordVersion is joined
	// into err, so that no pending operation is skipped in silence.
	Pending(ctx context.Context, after string, limit int) ([]Operation, error)

	// Claim is Pending for Resume: it returns up to limit pending records
	// with keys after after, in key order, that l.Owner holds or whose
	// lease has lapsed at l.At, and leases each to l.Owner until l.Until.
	// Records leased to others are skipped, and so are records another
	// Claim is taking at the same moment. Unreadable records are reported
	// as Pending reports them.
	Claim(ctx context.Context, l Lease, after string, limit int) ([]Operation, error)

	// Sweep deletes finished records last updated before cutoff and returns
	// how many it deleted. Pending records are never swept.
	Sweep(ctx context.Context, cutoff time.Time) (int, error)

	// Close makes every accepted change durable and releases the journal.
	// Later calls of every method return an error matching ErrClosed.
	Close() error
}

// CheckKey returns an error matching ErrInvalidKey unless key is 1 to 255
// bytes of visible ASCII: the check the journal makes of every key before
// it reserves it, so no KeyStore needs to.
func CheckKey(key string) error {
	if err := keys.Check(key); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidKey, err)
	}
	return nil
}

// LastChanger is an optional capability of a KeyStore: a store that knows
// when it last changed. A Client reads it when it opens the store and then
// trusts its clock for sweeping only as far as that time plus what it has
// measured since on its monotonic clock, so that a clock set days ahead does
// not sweep away the records (and name → key mappings) a server still
// honours. Without it, a Client sweeps by its clock alone.
type LastChanger interface {
	// LastChange returns when the journal last changed, or the zero time
	// for an empty journal.
	LastChange(ctx context.Context) (time.Time, error)
}

// Inspector is an optional capability of a KeyStore: reads that tools
// need beyond the Client's own. The idem command and package idemstatus
// use it to list every record and find one by name; without it they can
// list only pending operations (KeyStore.Pending) and find them by key.
type Inspector interface {
	// Named returns the record for an operation name, or an error matching
	// ErrNotFound.
	Named(ctx context.Context, name string) (Operation, error)
	// Walk returns up to limit records of any state with keys after after
	// ("" starts at the first), in key order, without their requests. It
	// changes nothing. Unreadable records are reported as Pending reports
	// them.
	Walk(ctx context.Context, after string, limit int) ([]Operation, error)
}

// Clock is an optional capability of a KeyStore shared by several
// processes: the store's own clock (for PostgreSQL, the database's), by
// which the leases of every process are judged. When a store implements
// it, a Client measures the offset between its local clock and the
// store's at New (taking the middle of the call's round trip), measures it
// again every few minutes in the background, and computes every time it
// passes to the store (Created, Updated, Lease.At and Until, Attempt.At,
// Outcome.At, Sweep's cutoff) as its local time plus that offset. A
// failed measurement keeps the last offset (0 before the first). Without
// Clock, a Client passes its local time: right for a store only one
// process uses at a time, such as the bbolt journal.
type Clock interface {
	// Now returns the store's current time.
	Now(ctx context.Context) (time.Time, error)
}

// Policy is the part of an application's configuration that travels with
// its journal, so that every opener (a second process, a newer release,
// the idem command) acts under it. The zero Policy means none is stored.
type Policy struct {
	// KeyHeader is the request header the application sends keys in;
	// "" means Idempotency-Key. Each operation also records its own
	// (Operation.KeyHeader), which is what a resend uses.
	KeyHeader string
	// ResendWindow is how long after its creation an operation may be sent
	// again (WithResendWindow).
	ResendWindow time.Duration
	// Retention is how long finished records are kept (WithRetention): the
	// floor below which no opener may sweep.
	Retention time.Duration
	// MatchWindow is how long a caller's resend of the same payload is
	// joined to its operation (WithResendMatchWindow).
	MatchWindow time.Duration
}

// PolicyStore is an optional capability of a KeyStore: a place for the
// application's Policy in the journal. A Client writes its policy there at
// Open and New, after checking it against the one stored; tools read it to
// act as the application would. Without it, every opener acts under its
// own settings only.
type PolicyStore interface {
	// Policy returns the stored policy: the zero Policy and a nil error
	// when none is stored.
	Policy(ctx context.Context) (Policy, error)
	// SetPolicy stores p, replacing the stored policy. It returns once the
	// change is durable.
	SetPolicy(ctx context.Context, p Policy) error
}
