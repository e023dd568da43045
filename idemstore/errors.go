package idemstore

import "errors"

// Errors about the journal. Each is returned wrapped; match with errors.Is.
var (
	// ErrNotFound is returned by a KeyStore when no record has the key or name.
	ErrNotFound = errors.New("idem: no such operation")
	// ErrJournalLocked is returned by Open when another process or handle
	// holds the journal file.
	ErrJournalLocked = errors.New("idem: journal is locked by another process or handle")
	// ErrJournalCorrupt is returned when the journal file or a record in it
	// cannot be read: a truncated, damaged or foreign file.
	ErrJournalCorrupt = errors.New("idem: journal is corrupt")
	// ErrRecordVersion is returned when a record was written by a newer
	// version of idem than this one.
	ErrRecordVersion = errors.New("idem: journal record has an unknown version")
	// ErrJournalWrite is returned when a change could not be made durable
	// (a full disk, a read-only file, an I/O error), when a bbolt journal
	// refuses writes after an earlier commit failed (until it is opened
	// again), or when the journal cannot be reached at all (a database
	// that is down). A request whose
	// reservation fails this way is not sent.
	ErrJournalWrite = errors.New("idem: journal write failed")
	// ErrOutcomeUnknown is returned when a change went to the journal and
	// its answer was lost (a connection that broke or a deadline that
	// passed after the change was sent), or when a commit failed after it
	// may have reached the disk (boltjournal: a failed fdatasync once its
	// meta page was written): it may be durable or not. A
	// request whose reservation fails this way is not sent by this call,
	// but its key may be journaled: the *Error carries that key with
	// StatePending, the operation is in doubt, and a re-drive of its name
	// or key, or Resume, finishes it. It never matches ErrJournalWrite.
	ErrOutcomeUnknown = errors.New("idem: journal change sent, outcome unknown")
	// ErrClosed is returned when the journal or Client was closed.
	ErrClosed = errors.New("idem: closed")
	// ErrLeaseLost is returned by KeyStore.Renew when the operation is no
	// longer pending under the caller's lease.
	ErrLeaseLost = errors.New("idem: operation lease lost")
	// ErrPolicyConflict is returned by Open, and by every keyed call and
	// Resume of a Client made by New, when the application's policy is
	// looser than what its journal's stored Policy allows (see
	// PolicyStore): for example a resend window longer than the journal's
	// retention keeps names. Nothing is sent.
	ErrPolicyConflict = errors.New("idem: policy conflicts with the journal's")
	// ErrInvalidKey is returned, before anything is journaled or sent,
	// for a key or operation name the journal refuses:
	//   - a key that is not 1 to 255 bytes of visible ASCII (CheckKey),
	//     from WithKey, a request's key header, or a store's own check;
	//   - a key the Client's Provider does not accept (longer than its
	//     KeyMaxLen, or with a byte outside its KeyChars), or a Provider
	//     whose key format no UUIDv7 form fits, so no key can be made;
	//   - a key header that holds two different keys;
	//   - an operation name (WithOperation) that is not 1 to 1024 bytes of
	//     valid UTF-8 without NUL bytes;
	//   - a key a store's format cannot hold (the bbolt journal: an empty
	//     key or one ending in a NUL byte, which CheckKey refuses first);
	//   - a key that could not be generated (the system's random source
	//     failed).
	ErrInvalidKey = errors.New("idem: invalid idempotency key")
	// ErrInProgress is returned when the operation is in flight elsewhere:
	// another call or Resume in this process, or another process holding
	// its lease, is sending it, and the wait for it ended first.
	ErrInProgress = errors.New("idem: operation already in flight")
)
