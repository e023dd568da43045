package idemserver

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"runtime/debug"
	"sync/atomic"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/idemgo/idem/internal/codec"
	"github.com/idemgo/idem/internal/groupcommit"
)

// BoltOptions tune a BoltStore. A nil *BoltOptions, and every zero field,
// means the default.
type BoltOptions struct {
	// LockTimeout bounds how long OpenBoltStore waits for another process
	// or handle to release the file before it returns an error matching
	// ErrStoreLocked. Zero means 2 seconds.
	LockTimeout time.Duration
	// MaxGroup caps how many changes one commit (one fsync) carries. Zero
	// means 1024.
	MaxGroup int
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
// commit that fails returns an error matching ErrStoreWrite and changes
// nothing. A damaged file or record gives errors matching ErrStoreCorrupt,
// never a panic and never a replay.
type BoltStore struct {
	db      *bolt.DB
	w       *groupcommit.Writer[*bolt.Tx]
	file    *os.File    // bbolt's file handle, to release a broken store
	broken  atomic.Bool // bbolt panicked or faulted; its locks may be held
	closed  atomic.Bool
	flights flights // the keys in flight
}

var _ Store = (*BoltStore)(nil)

var (
	bucketMeta    = []byte("meta")
	bucketKeys    = []byte("keys")   // id -> record
	bucketExpiry  = []byte("expiry") // expires (8 bytes, big endian) + id -> nil
	metaFormatKey = []byte("format")
	metaFormat    = []byte("idemserver-bolt-2") // records in internal/codec's server format
	metaFormatV1  = []byte("idemserver-bolt-1") // records of an earlier release, without checksums
)

// OpenBoltStore opens the store in the file at path, creating it (mode
// 0600) if it does not exist. It returns an error matching ErrStoreLocked
// when another process or handle holds the file, ErrStoreCorrupt when the
// file is damaged, empty (a store that lost its contents, not a new one)
// or not a store of this package (the journal of an idem Client is not
// one), and ErrStoreWrite when it cannot be written.
func OpenBoltStore(path string, o *BoltOptions) (*BoltStore, error) {
	if fi, err := os.Stat(path); err == nil && fi.Size() == 0 {
		return nil, fmt.Errorf("idemserver: open store %s: %w: the file is empty: a store that lost its contents, not a new one (remove it to start a new store)", path, ErrStoreCorrupt)
	}
	var opt BoltOptions
	if o != nil {
		opt = *o
	}
	if opt.LockTimeout <= 0 {
		opt.LockTimeout = 2 * time.Second
	}
	s := &BoltStore{}
	if err := s.open(path, opt.LockTimeout); err != nil {
		return nil, fmt.Errorf("idemserver: open store %s: %w", path, err)
	}
	if err := s.guarded(s.init); err != nil {
		_ = s.release()
		return nil, fmt.Errorf("idemserver: open store %s: %w", path, err)
	}
	s.w = groupcommit.New(s.update, groupcommit.Options{MaxGroup: opt.MaxGroup})
	return s, nil
}

// open opens the bbolt file and maps its errors to the package's
// sentinels. A damaged file can make bbolt panic or fault on its memory
// map; both become ErrStoreCorrupt.
func (s *BoltStore) open(path string, timeout time.Duration) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			if s.file != nil {
				_ = s.file.Close()
			}
			err = fmt.Errorf("%w: %v", ErrStoreCorrupt, p)
		}
	}()
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout:      timeout,
		FreelistType: bolt.FreelistMapType,
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			f, err := os.OpenFile(name, flag, perm)
			s.file = f
			return f, err
		},
	})
	if err != nil {
		return mapOpenError(err)
	}
	s.db = db
	return nil
}

func mapOpenError(err error) error {
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return fmt.Errorf("%w: %w", ErrStoreLocked, err)
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS), errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %w", ErrStoreWrite, err)
	}
	// bbolt reports most damage (a file shorter than its pages, a bad
	// checksum, a foreign file) with errors of its own or plain ones.
	return fmt.Errorf("%w: %w", ErrStoreCorrupt, err)
}

// init checks the format marker and creates the buckets of a new store.
func (s *BoltStore) init() error {
	fi, err := s.file.Stat()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStoreCorrupt, err)
	}
	err = s.db.View(func(tx *bolt.Tx) error {
		if fi.Size() < tx.Size() {
			return fmt.Errorf("%w: file is %d bytes, its pages need %d (truncated)", ErrStoreCorrupt, fi.Size(), tx.Size())
		}
		return nil
	})
	if err != nil {
		return err
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		if m := tx.Bucket(bucketMeta); m != nil {
			switch f := m.Get(metaFormatKey); {
			case bytes.Equal(f, metaFormat):
			case bytes.Equal(f, metaFormatV1):
				// Records without checksums: an earlier release's store of
				// stored answers, which a client's retry within the
				// retention would still find. Refused, not read.
				return fmt.Errorf("%w: store format %q of an earlier idemserver, without checksums: "+
					"wait until its retention has passed, then delete the file or open another path", ErrStoreCorrupt, f)
			default:
				return fmt.Errorf("%w: store format %q, want %q", ErrStoreCorrupt, f, metaFormat)
			}
		} else {
			if c := tx.Cursor(); func() bool { k, _ := c.First(); return k != nil }() {
				return fmt.Errorf("%w: not an idemserver store (no format marker)", ErrStoreCorrupt)
			}
			m, err := tx.CreateBucket(bucketMeta)
			if err != nil {
				return err
			}
			if err := m.Put(metaFormatKey, metaFormat); err != nil {
				return err
			}
		}
		for _, name := range [][]byte{bucketKeys, bucketExpiry} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return fmt.Errorf("%w: bucket %s: %w", ErrStoreCorrupt, name, err)
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, ErrStoreCorrupt) {
		return fmt.Errorf("%w: %w", ErrStoreWrite, err)
	}
	return err
}

// guarded runs f with a fault or panic inside bbolt (a damaged page)
// turned into ErrStoreCorrupt; after one, the store refuses all access.
func (s *BoltStore) guarded(f func() error) (err error) {
	if s.broken.Load() {
		return fmt.Errorf("%w: an earlier access failed", ErrStoreCorrupt)
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			s.broken.Store(true)
			err = fmt.Errorf("%w: %v", ErrStoreCorrupt, p)
		}
	}()
	return f()
}

// update is the group-commit writer's transaction.
func (s *BoltStore) update(fn func(*bolt.Tx) error) error {
	return s.guarded(func() error { return s.db.Update(fn) })
}

// write runs fn in the next group commit and waits until it is durable.
func (s *BoltStore) write(ctx context.Context, fn func(*bolt.Tx) error) error {
	if s.closed.Load() {
		return ErrClosed
	}
	err := s.w.Do(ctx, fn)
	switch {
	case err == nil, errors.Is(err, ErrLockLost), errors.Is(err, ErrStoreCorrupt):
		return err
	case errors.Is(err, groupcommit.ErrClosed):
		return ErrClosed
	case ctx.Err() != nil && errors.Is(err, context.Cause(ctx)):
		return err
	}
	return fmt.Errorf("%w: %w", ErrStoreWrite, err)
}

// read runs fn in a read-only transaction.
func (s *BoltStore) read(fn func(*bolt.Tx) error) error {
	if s.closed.Load() {
		return ErrClosed
	}
	return s.guarded(func() error { return s.db.View(fn) })
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
	for {
		n := 0
		err := s.write(ctx, func(tx *bolt.Tx) error {
			n = 0
			var ids [][]byte
			c := tx.Bucket(bucketExpiry).Cursor()
			for k, _ := c.First(); k != nil && n < sweepChunk; k, _ = c.Next() {
				if len(k) < 8 || int64(binary.BigEndian.Uint64(k)) > now.UnixNano() {
					break
				}
				ids = append(ids, append([]byte(nil), k[8:]...))
				n++
			}
			for _, id := range ids {
				if err := drop(tx, string(id)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return total, err
		}
		total += n
		if n < sweepChunk {
			return total, nil
		}
	}
}

// Close implements Store: it waits for the changes in flight, then closes
// the file.
func (s *BoltStore) Close() error {
	if s.closed.Swap(true) {
		return ErrClosed
	}
	_ = s.w.Close()
	return s.release()
}

// release closes the bbolt file. After bbolt panicked its locks may be
// held, so DB.Close would block forever: then only the file is closed,
// which releases the lock on it.
func (s *BoltStore) release() error {
	if s.broken.Load() {
		return s.file.Close()
	}
	return s.db.Close()
}

// record is a stored key: in flight while resp is nil.
type record struct {
	fingerprint string
	token       string
	expires     time.Time
	resp        *Response
}

func expiryKey(t time.Time, id string) []byte {
	k := make([]byte, 8, 8+len(id))
	binary.BigEndian.PutUint64(k, uint64(max(t.UnixNano(), 0)))
	return append(k, id...)
}

func get(tx *bolt.Tx, id string) (*record, error) {
	v := tx.Bucket(bucketKeys).Get([]byte(id))
	if v == nil {
		return nil, nil
	}
	r, err := decode(v)
	if err != nil {
		return nil, fmt.Errorf("%w: record %s: %w", ErrStoreCorrupt, id, err)
	}
	return r, nil
}

func put(tx *bolt.Tx, id string, r *record) error {
	if err := tx.Bucket(bucketKeys).Put([]byte(id), encode(r)); err != nil {
		return err
	}
	return tx.Bucket(bucketExpiry).Put(expiryKey(r.expires, id), nil)
}

// drop deletes the record id and its expiry entry, if there is one.
func drop(tx *bolt.Tx, id string) error {
	r, err := get(tx, id)
	if err != nil || r == nil {
		return err
	}
	if err := tx.Bucket(bucketExpiry).Delete(expiryKey(r.expires, id)); err != nil {
		return err
	}
	return tx.Bucket(bucketKeys).Delete([]byte(id))
}

// encode writes a record in the codec's server format (versioned,
// checksummed, headers sorted).
func encode(r *record) []byte {
	c := codec.ServerRecord{Kind: codec.ServerInFlight, Expires: r.expires.UnixNano(), Fingerprint: r.fingerprint, Token: r.token}
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
	r := &record{expires: time.Unix(0, c.Expires), fingerprint: c.Fingerprint, token: c.Token}
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
