package boltjournal

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem/idemstore"
	"github.com/idemgo/idem/internal/boltfile"
)

// This file holds Store's options, its buckets and format marker and
// its file; the file handling itself (opening and locking the file at the
// path, the format marker, compaction at Open, turning bbolt's faults into
// idem's sentinels, the checks that the file still has its name and has
// not gone back to an older copy) is internal/boltfile's, shared with
// idemserver's BoltStore. boltscrub.go scrubs its free pages, boltcheck.go
// checks its records, boltstore.go holds the store, its group commit and
// its reads, boltwrite.go the KeyStore methods that change records,
// boltscratch.go what the changes of one transaction share and the
// changes reused once committed, boltrecord.go the records and the
// policy, boltwalk.go the walks.

// Options tune a Store. A nil *Options, and every zero field,
// means the default.
type Options struct {
	// LockTimeout bounds how long Open waits for another process
	// or handle (in this process too) to release the journal file before it
	// returns an error matching ErrJournalLocked. Zero (or less) means 2
	// seconds.
	LockTimeout time.Duration
	// MaxGroup caps how many changes one commit (one fsync) carries. Zero
	// (or less) means 1024.
	MaxGroup int
	// Logger receives warnings the store cannot return to a caller: a
	// record Sweep kept because it could not read it, or a commit of
	// changes queued by Attempt or Finish that failed. Nil is silent.
	Logger *slog.Logger
	// OnWriteError, if set, is called (on the goroutine that led the
	// commit, a caller's or the store's timer; it must not block) when a commit carrying changes queued by Attempt
	// or Finish failed. Those changes are kept and ride the next commit
	// (after a failed fsync the store refuses them with every write: see
	// Store); Close returns an error if they still cannot be written.
	OnWriteError func(error)
	// OnCommit, if set, is called on the goroutine that led the commit (a
	// caller's, or the store's timer) after every group commit with the number of changes it carried, how long it
	// took (fsyncs included) and its error: the journal's commit latency
	// and group size, for metrics. It must not block.
	OnCommit func(changes int, latency time.Duration, err error)
	// ScrubDelay bounds how long the request (header and body) of a
	// finished operation may stay readable in the free pages of the file:
	// bbolt frees pages without clearing them, so the store overwrites the
	// free pages with zeros, in a commit at most ScrubDelay after a finish.
	// Zero means 1 second; a negative value scrubs only at Close.
	ScrubDelay time.Duration

	// SkipCheck opens a journal without Open's check of its pending
	// records and name mappings, for tools that read what they can of a
	// damaged journal (the idem command's ls, pending, show and stats,
	// with Store.Salvage). An application must not set it: the check
	// is what keeps it from trusting a damaged journal.
	SkipCheck bool
	// ReadOnly opens an existing journal for reading only, under a shared
	// lock, for tools (the idem command's verify, ls, pending, show and
	// stats): nothing is written to the file, not even a compaction or a
	// scrub. Every change fails with an error matching ErrJournalWrite.
	ReadOnly bool

	// beforeCompact runs when Open has decided to compact the journal,
	// with its lock held. It exists for tests.
	beforeCompact func()
	// asyncDelay, if set, replaces how long queued Attempt and Finish
	// marks wait for a durable write to carry them (groupcommit's
	// AsyncDelay). It exists for tests that need the marks to ride a
	// given commit.
	asyncDelay time.Duration
}

// Defaults of Options.
const (
	defaultLockTimeout = boltfile.DefaultLockTimeout
	defaultMaxGroup    = 1024
	defaultScrubDelay  = time.Second
)

// Journal format 2: bucket names and the format marker. meta holds the
// marker that tells an idem journal from another bbolt file; ops maps each
// key to its record (codec version 2, the request inline while pending);
// names maps an operation name to its key. There are no other indexes:
// Pending, Claim and Sweep walk ops in key order.
var (
	bucketMeta    = []byte("meta")
	bucketOps     = []byte("ops")
	bucketNames   = []byte("names")
	metaFormatKey = []byte("format")
	metaFormat    = []byte("idem-journal/2")
	formatPrefix  = "idem-journal/"
)

// opsFill is the fill percent of the ops bucket's pages. UUIDv7 keys are
// appended in order, so bbolt's default of one half would leave every page
// half empty.
const opsFill = 0.9

// boltFile is the bbolt file of a Store (internal/boltfile: opening,
// locking, format marker, compaction at Open, the fault guard, the
// "still the file at this path" and "not gone back" checks) and the state
// of its scrubs (boltscrub.go).
type boltFile struct {
	*boltfile.File

	// scrubbed[id] is set for a free page that was zeroed and stayed free.
	scrubbed []bool
	// dropped is the highest transaction ID that dropped a request;
	// scrubbedTo the highest one whose freed pages were zeroed.
	dropped, scrubbedTo atomic.Uint64
	// kick, if set, is called when a transaction drops a request.
	kick func()
}

// journalErrors are the sentinels the journal file's errors match.
var journalErrors = boltfile.Errors{
	Locked:  idemstore.ErrJournalLocked,
	Corrupt: idemstore.ErrJournalCorrupt,
	Write:   idemstore.ErrJournalWrite,
	Unknown: idemstore.ErrOutcomeUnknown,
	Closed:  idemstore.ErrClosed,
}

// openFile opens, or creates, the bbolt file at path, checks its format
// and compacts it if it is mostly free. Only a missing file creates a
// journal: an existing empty or short file is a lost journal
// (ErrJournalCorrupt).
func openFile(path string, timeout time.Duration, readOnly bool, beforeCompact func()) (*boltFile, error) {
	if path == "" {
		return nil, fmt.Errorf("open journal: %w: empty path", idemstore.ErrJournalWrite)
	}
	bf, err := boltfile.Open(path, boltfile.Options{
		Kind:        "journal",
		Foreign:     "an idem journal",
		Errors:      journalErrors,
		LockTimeout: timeout,
		Meta:        bucketMeta,
		FormatKey:   metaFormatKey,
		Marker:      metaFormat,
		CheckFormat: checkFormat,
		Buckets:     [][]byte{bucketOps, bucketNames},
		Compact:     true,
		ReadOnly:    readOnly,
		// Format 2 made both buckets with the marker: a missing one was lost,
		// and with it what the journal knew.
		BucketsRequired: true,
		BeforeCompact:   beforeCompact,
	})
	if err != nil {
		return nil, fmt.Errorf("open journal %s: %w", path, err)
	}
	return &boltFile{File: bf}, nil
}

// checkFormat checks the journal's format marker: the current format is
// read; another idem format matches ErrRecordVersion and says what to do;
// anything else is damage.
func checkFormat(got []byte) error {
	if bytes.Equal(got, metaFormat) {
		return nil
	}
	v, ok := strings.CutPrefix(string(got), formatPrefix)
	switch {
	case !ok:
		return fmt.Errorf("%w: journal format marker %q, want %q", idemstore.ErrJournalCorrupt, got, metaFormat)
	case v < string(metaFormat[len(formatPrefix):]) && len(v) <= len(metaFormat)-len(formatPrefix):
		return fmt.Errorf("%w: the journal has format %s, written by an earlier, unreleased version of idem that this one cannot read: "+
			"resume or reconcile its pending operations with the version that wrote it, then move the file away to start a new journal", idemstore.ErrRecordVersion, got)
	}
	return fmt.Errorf("%w: the journal has format %s, written by a newer version of idem (this one reads %s): open it with that version", idemstore.ErrRecordVersion, got, metaFormat)
}
