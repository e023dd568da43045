package idem

import "github.com/idemgo/idem/idemstore"

// The store contract lives in package idemstore, for store authors; these
// aliases keep it at hand for callers.

// Operation is idemstore.Operation: one keyed operation as the journal records it.
type Operation = idemstore.Operation

// State is idemstore.State: where an operation stands in its lifecycle.
type State = idemstore.State

// The states of an operation: see idemstore.StatePending and the others.
const (
	StatePending   = idemstore.StatePending
	StateSucceeded = idemstore.StateSucceeded
	StateFailed    = idemstore.StateFailed
	StateExpired   = idemstore.StateExpired
)

// Lease is idemstore.Lease: a claim on a pending operation.
type Lease = idemstore.Lease

// Request is idemstore.Request: the replayable request of a pending record.
type Request = idemstore.Request

// Attempt is idemstore.Attempt: what KeyStore.Attempt records.
type Attempt = idemstore.Attempt

// Outcome is idemstore.Outcome: what KeyStore.Finish records.
type Outcome = idemstore.Outcome

// Policy is idemstore.Policy: the configuration that travels with a journal.
type Policy = idemstore.Policy

// KeyStore is idemstore.KeyStore: the journal behind a Client.
type KeyStore = idemstore.KeyStore

// LastChanger is idemstore.LastChanger: a store that knows when it last changed.
type LastChanger = idemstore.LastChanger

// Inspector is idemstore.Inspector: the reads tools need beyond the Client's.
type Inspector = idemstore.Inspector

// Clock is idemstore.Clock: the clock of a store shared by processes.
type Clock = idemstore.Clock

// PolicyStore is idemstore.PolicyStore: a place for the Policy in the journal.
type PolicyStore = idemstore.PolicyStore

// MaxHistory is idemstore.MaxHistory: the bound of Operation.History.
const MaxHistory = idemstore.MaxHistory

// MaxReason is idemstore.MaxReason: the bound of Attempt.Reason, in bytes.
const MaxReason = idemstore.MaxReason

// RetentionMargin is idemstore.RetentionMargin: how much longer than the resend window finished records are kept at least.
const RetentionMargin = idemstore.RetentionMargin

// CheckKey is idemstore.CheckKey: it returns an error matching ErrInvalidKey unless key is 1 to 255 bytes of visible ASCII.
func CheckKey(key string) error { return idemstore.CheckKey(key) }

// AppendHistory is idemstore.AppendHistory: the change KeyStore.Attempt makes to History.
func AppendHistory(h []Attempt, a Attempt) []Attempt { return idemstore.AppendHistory(h, a) }

// TrimQuery is idemstore.TrimQuery: u without its query and fragment.
func TrimQuery(u string) string { return idemstore.TrimQuery(u) }

// ValidTraceparent is idemstore.ValidTraceparent: whether s is a well-formed W3C traceparent.
func ValidTraceparent(s string) bool { return idemstore.ValidTraceparent(s) }

// Errors about the journal, which stores return: see package idemstore.
// Each is returned wrapped; match with errors.Is.
var (
	// ErrNotFound is idemstore.ErrNotFound: no record has the key or name.
	ErrNotFound = idemstore.ErrNotFound
	// ErrJournalLocked is idemstore.ErrJournalLocked: another process or handle holds the journal file.
	ErrJournalLocked = idemstore.ErrJournalLocked
	// ErrJournalCorrupt is idemstore.ErrJournalCorrupt: the journal or a record in it cannot be read.
	ErrJournalCorrupt = idemstore.ErrJournalCorrupt
	// ErrRecordVersion is idemstore.ErrRecordVersion: a record was written by a newer idem.
	ErrRecordVersion = idemstore.ErrRecordVersion
	// ErrJournalWrite is idemstore.ErrJournalWrite: a change could not be made durable.
	ErrJournalWrite = idemstore.ErrJournalWrite
	// ErrOutcomeUnknown is idemstore.ErrOutcomeUnknown: a change went to the journal and its outcome is unknown (its answer lost, or its commit failed after it may have reached the disk).
	ErrOutcomeUnknown = idemstore.ErrOutcomeUnknown
	// ErrClosed is idemstore.ErrClosed: the journal or Client was closed.
	ErrClosed = idemstore.ErrClosed
	// ErrLeaseLost is idemstore.ErrLeaseLost: the operation is no longer pending under the caller's lease.
	ErrLeaseLost = idemstore.ErrLeaseLost
	// ErrPolicyConflict is idemstore.ErrPolicyConflict: the application's policy is looser than its journal's.
	ErrPolicyConflict = idemstore.ErrPolicyConflict
	// ErrInvalidKey is idemstore.ErrInvalidKey: a key or operation name the
	// journal refuses (its doc lists each case).
	ErrInvalidKey = idemstore.ErrInvalidKey
	// ErrInProgress is idemstore.ErrInProgress: the operation is in flight elsewhere.
	ErrInProgress = idemstore.ErrInProgress
)
