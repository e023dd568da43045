package idemserver

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/idemgo/idem/idemstore"
	"github.com/idemgo/idem/internal/boltfile"
	"github.com/idemgo/idem/internal/codec"
	"github.com/idemgo/idem/internal/groupcommit"
)

// BoltOptions tune a BoltStore. A nil *BoltOptions, and every zero field,
// means the default.
type BoltOptions struct {
	// LockTimeout bounds how long OpenBoltStore waits for another process
	// or handle to release the file before it returns an error matching
	// idem.ErrJournalLocked. Zero means 2 seconds.
	LockTimeout time.Duration
	// MaxGroup caps how many changes one commit (one fsync) carries. Zero
	// means 1024.
	MaxGroup int
	// OnCommit, if set, is called on the store's writer goroutine after
	// every group commit with the number of changes it carried, how long
	// it took (fsyncs included) and its error: the store's commit latency
	// and group size, for metrics. It must not block.
	OnCommit func(changes int, latency time.Duration, err error)
}

// BoltStore is a Store in a bbolt file of its own, for a single process
// (bbolt locks the file): stored responses survive a crash or restart of
// the process but are not shared with other replicas.
//
// One durable commit per new key: only one process can open the file, so
// the keys in flight (claimed, renewed, released) live in the process's
// memory, and Complete is the one commit, with fsync, that a new key
// costs; completions of concurrent requests share one commit (group
// commit), so throughput grows with concurrency. Begin answers a done key
// from a read-only transaction. A crash frees the keys that were in
// flight at once rather than at the end of their leases: no handler of
// the dead process can still be running, so the next request with such a
// key runs its handler, as it would after a lapsed lease (see Step). A
// commit that fails for certain (a full disk) returns an error matching
// idem.ErrJournalWrite and changes nothing. One that may have taken effect
// all the same (an fsync that failed after bbolt wrote its meta page:
// idem.ErrOutcomeUnknown), and any failed fsync or I/O error, leave the
// file's state unknown: Complete returns the error (the answer is
// withheld), the key is neither run again nor replayed (a retry is told
// it is in flight), and every new key is refused (idem.ErrJournalWrite)
// until the store is opened again, which reads the file anew. A damaged file or record gives errors matching idem.ErrJournalCorrupt,
// never a panic and never a replay.
//
// Stored responses are kept in the file in the order they expire, so that
// the records a group commit adds are neighbours, written in a few pages
// whatever their keys; the store finds a key's record through an index
// in memory, of a 64-bit hash of each stored key and its record's expiry.
// Open builds it, presized, from an index bucket of 32 bytes per key in
// the file, never reading the records: at most 40 bytes of memory per
// stored key whatever the length of its id or answer (38 at one million
// keys), given back as sweeps delete the keys. See BENCHMARKS.md for
// Open's time and memory at millions of keys.
type BoltStore struct {
	f      *boltfile.File
	w      *groupcommit.Writer[*bolt.Tx]
	closed atomic.Bool
	gone   atomic.Bool // a commit failed with the path no longer naming the file
	// uncertain: a commit failed with its record perhaps in the file; the
	// store refuses new keys until it is opened again (see Complete).
	uncertain atomic.Bool
	flights   flights // the keys in flight and the index of stored keys
}

var _ LocalStore = (*BoltStore)(nil)

var (
	bucketMeta    = []byte("meta")
	bucketRecords = []byte("records") // expires (8 bytes, big endian) + id -> record
	metaFormatKey = []byte("format")
	metaFormat    = []byte("idemserver-bolt-4") // records in internal/codec's server format, in expiry order, and their index
	metaFormatV3  = []byte("idemserver-bolt-3") // the same records without the index bucket: migrated at Open
	metaFormatV2  = []byte("idemserver-bolt-2") // the same records by id, and an expiry index: migrated at Open
	metaFormatV1  = []byte("idemserver-bolt-1") // records of an earlier release, without checksums

	// The buckets of format 2.
	bucketKeys   = []byte("keys")   // id -> record
	bucketExpiry = []byte("expiry") // expires (8 bytes, big endian) + id -> nil
)

// OpenBoltStore opens the store in the file at path, creating it (mode
// 0600) if it does not exist. It returns an error matching idem.ErrJournalLocked
// when another process or handle holds the file, idem.ErrJournalCorrupt when the
// file is damaged, truncated, empty (a store that lost its contents, not
// a new one) or not a store of this package (the journal of an idem Client
// is not one), and idem.ErrJournalWrite when it cannot be created or written (a
// directory, a missing parent directory, a read-only file system).
//
// The file handling is the idem journal's (internal/boltfile): after
// taking the lock, Open checks that the locked file is still the one at
// the path, and waits for the new one if another opener replaced it; a
// path that is a symbolic link is followed and stays one; a file of at
// least 16 MiB that is more than half free pages (after a burst whose
// responses have expired) is compacted at Open. Every commit first checks
// that the path still names the open file (once one found it does not,
// a Begin that would run a handler fails too, until it does again), and
// every transaction that the file has not gone back to an older copy
// (idem.ErrJournalCorrupt); Close reports both.
//
// A file of an earlier release's format is converted to this one at Open:
// format 3 (no index bucket) gets its index, in one transaction that reads
// every record once; format 2 (records by key) is moved into expiry order
// first, in another. The previous release refuses a converted file
// (idem.ErrJournalCorrupt, "store format").
func OpenBoltStore(path string, o *BoltOptions) (*BoltStore, error) {
	var opt BoltOptions
	if o != nil {
		opt = *o
	}
	f, err := boltfile.Open(path, boltfile.Options{
		Kind:        "store",
		Foreign:     "an idemserver store",
		Errors:      storeErrors,
		LockTimeout: opt.LockTimeout,
		Meta:        bucketMeta,
		FormatKey:   metaFormatKey,
		Marker:      metaFormat,
		CheckFormat: checkFormat,
		Buckets:     [][]byte{bucketRecords, bucketIndex},
		Compact:     true,
	})
	if err != nil {
		return nil, fmt.Errorf("idemserver: open store %s: %w", path, err)
	}
	s := &BoltStore{f: f}
	if err := s.load(); err != nil {
		_ = f.Release()
		return nil, fmt.Errorf("idemserver: open store %s: %w", path, err)
	}
	s.w = groupcommit.New(f.Update, groupcommit.Options{MaxGroup: opt.MaxGroup, Recover: f.Corrupt, OnCommit: opt.OnCommit})
	return s, nil
}

// storeErrors are the sentinels the store file's errors match.
var storeErrors = boltfile.Errors{
	Locked:  idemstore.ErrJournalLocked,
	Corrupt: idemstore.ErrJournalCorrupt,
	Write:   idemstore.ErrJournalWrite,
	Unknown: idemstore.ErrOutcomeUnknown,
	Closed:  ErrClosed,
}

// checkFormat checks the store's format marker.
func checkFormat(f []byte) error {
	switch {
	case bytes.Equal(f, metaFormat), bytes.Equal(f, metaFormatV3), bytes.Equal(f, metaFormatV2):
		return nil
	case bytes.Equal(f, metaFormatV1):
		// Records without checksums: an earlier release's store of
		// stored answers, which a client's retry within the retention
		// would still find. Refused, not read.
		return fmt.Errorf("%w: store format %q of an earlier idemserver, without checksums: "+
			"wait until its retention has passed, then delete the file or open another path", idemstore.ErrJournalCorrupt, f)
	}
	return fmt.Errorf("%w: store format %q, want %q", idemstore.ErrJournalCorrupt, f, metaFormat)
}

// write runs fn in the next group commit and waits until it is durable.
func (s *BoltStore) write(ctx context.Context, fn func(*bolt.Tx) error) error {
	if s.closed.Load() {
		return ErrClosed
	}
	err := s.w.Do(ctx, fn)
	if err != nil && errors.Is(err, idemstore.ErrJournalWrite) && s.f.StillNamed() != nil {
		// Removed or renamed over: a new key's Begin, which reads no
		// transaction, must not hand out keys whose answers cannot be
		// stored (see Begin).
		s.gone.Store(true)
	}
	switch {
	case err == nil, errors.Is(err, ErrLockLost), errors.Is(err, idemstore.ErrJournalCorrupt), errors.Is(err, idemstore.ErrJournalWrite):
		return err
	case errors.Is(err, groupcommit.ErrClosed):
		return ErrClosed
	case ctx.Err() != nil && errors.Is(err, context.Cause(ctx)):
		return err
	}
	return fmt.Errorf("%w: %w", idemstore.ErrJournalWrite, err)
}

// read runs fn in a read-only transaction.
func (s *BoltStore) read(fn func(*bolt.Tx) error) error {
	if s.closed.Load() {
		return ErrClosed
	}
	return s.f.View(fn)
}

// sweepChunk bounds the records one sweep transaction deletes.
const sweepChunk = 1000

// Sweep implements Store. It deletes the keys in flight whose lease
// lapsed, then the stored responses that expired, in transactions of at
// most a thousand records, so that requests are not held up behind one
// large commit.
func (s *BoltStore) Sweep(ctx context.Context, now time.Time) (int, error) {
	if s.closed.Load() {
		return 0, ErrClosed
	}
	total := s.flights.sweep(now)
	var gone [][]byte
	until := expiresAt(now)
	for {
		err := s.write(ctx, func(tx *bolt.Tx) error {
			gone = gone[:0]
			b, idx := tx.Bucket(bucketRecords), tx.Bucket(bucketIndex)
			c := b.Cursor()
			for k, _ := c.First(); k != nil && len(gone) < sweepChunk; k, _ = c.Next() {
				if len(k) >= 8 && binary.BigEndian.Uint64(k) > until {
					break
				}
				gone = append(gone, append([]byte(nil), k...))
			}
			for _, k := range gone {
				if err := b.Delete(k); err != nil {
					return err
				}
				if len(k) >= 8 {
					if err := indexSub(idx, binary.BigEndian.Uint64(k), idHash(string(k[8:]))); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err != nil {
			return total, err
		}
		s.flights.forget(gone)
		total += len(gone)
		if len(gone) < sweepChunk {
			return total, nil
		}
	}
}

// Close implements Store: it waits for the changes in flight, then closes
// the file. A file found damaged, replaced or gone back to an older copy
// while open is reported (idem.ErrJournalCorrupt, idem.ErrJournalWrite): what it
// accepted may be lost.
func (s *BoltStore) Close() error {
	if s.closed.Swap(true) {
		return ErrClosed
	}
	_ = s.w.Close()
	var rerr error
	if !s.f.Broken() {
		rerr = s.f.View(func(*bolt.Tx) error { return nil })
		if rerr == nil {
			rerr = s.f.StillNamed()
		}
	} else {
		rerr = fmt.Errorf("%w: it was found damaged or replaced while open; responses stored since may be lost", idemstore.ErrJournalCorrupt)
	}
	if rerr != nil {
		rerr = fmt.Errorf("idemserver: close store: %w", rerr)
	}
	return errors.Join(rerr, s.f.Release())
}

// record is a stored key: in flight while resp is nil (a record this
// release never writes: it keeps its flights in memory).
type record struct {
	fingerprint string
	expires     time.Time
	resp        *Response
}

// expiresAt returns t as the records bucket orders it: Unix nanoseconds,
// times before 1970 as 0.
func expiresAt(t time.Time) uint64 { return uint64(max(t.UnixNano(), 0)) }

// recordKey returns the records bucket's key of the record of id that
// expires at exp (see expiresAt).
func recordKey(exp uint64, id string) []byte {
	k := make([]byte, 8, 8+len(id))
	binary.BigEndian.PutUint64(k, exp)
	return append(k, id...)
}

// get reads the record of id that expires at exp, or nil if there is none.
func get(tx *bolt.Tx, id string, exp uint64) (*record, error) {
	v := tx.Bucket(bucketRecords).Get(recordKey(exp, id))
	if v == nil {
		return nil, nil
	}
	r, err := decode(v)
	if err == nil && expiresAt(r.expires) != exp {
		err = fmt.Errorf("expiry %d under the key of expiry %d", r.expires.UnixNano(), exp)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: record %s: %w", idemstore.ErrJournalCorrupt, id, err)
	}
	return r, nil
}

// encode writes a record in the codec's server format (versioned,
// checksummed, headers sorted); of a response not kept, only its status.
func encode(r *record) []byte {
	c := codec.ServerRecord{Kind: codec.ServerInFlight, Expires: r.expires.UnixNano(), Fingerprint: r.fingerprint}
	switch {
	case r.resp == nil:
	case r.resp.NotKept:
		c.Kind, c.Status = codec.ServerNotKept, r.resp.Status
	default:
		c.Kind, c.Status, c.Header, c.Body = codec.ServerDone, r.resp.Status, r.resp.Header, r.resp.Body
	}
	return codec.ServerAppend(nil, &c)
}

// decode reads a record; the strings and body it returns are copies, as
// bbolt's memory is valid only inside the transaction. A damaged record
// is an error, never a response to replay.
func decode(v []byte) (*record, error) {
	var c codec.ServerRecord
	if err := codec.ServerDecode(v, &c); err != nil {
		return nil, err
	}
	r := &record{expires: time.Unix(0, c.Expires), fingerprint: c.Fingerprint}
	switch c.Kind {
	case codec.ServerNotKept:
		r.resp = &Response{Status: c.Status, NotKept: true}
	case codec.ServerDone:
		r.resp = &Response{Status: c.Status, Header: http.Header(c.Header), Body: c.Body}
		if r.resp.Header == nil {
			r.resp.Header = http.Header{}
		}
		if r.resp.Body == nil {
			r.resp.Body = []byte{}
		}
	}
	return r, nil
}
