package idem

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemgo/idem/internal/codec"
	"github.com/idemgo/idem/internal/groupcommit"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// BoltOptions tune a BoltStore. A nil *BoltOptions, and every zero field,
// means the default.
type BoltOptions struct {
	// LockTimeout bounds how long OpenBoltStore waits for another process
	// or handle (in this process too) to release the journal file before it
	// returns an error matching ErrJournalLocked. Zero means 2 seconds.
	LockTimeout time.Duration
	// MaxGroup caps how many changes one commit (one fsync) carries. Zero
	// means 1024.
	MaxGroup int
	// Logger receives warnings the store cannot return to a caller: a
	// record it skipped because it could not read it, or a change that
	// Attempt or Finish queued and that failed to commit. Nil is silent.
	Logger *slog.Logger

	// perWrite makes every change its own bbolt Update, without group
	// commit. It exists for the benchmarks' baseline.
	perWrite bool
}

// Defaults of BoltOptions.
const (
	defaultLockTimeout = 2 * time.Second
	defaultMaxGroup    = 1024
	sweepChunk         = 1000
)

// Bucket names. meta holds the format marker that tells an idem journal
// from another bbolt file.
var (
	bucketMeta    = []byte("meta")
	bucketOps     = []byte("ops")     // key -> codec record
	bucketNames   = []byte("names")   // operation name -> key
	bucketPending = []byte("pending") // key -> nothing, while pending
	bucketDone    = []byte("done")    // updated (8 bytes) + key -> nothing
	bucketBodies  = []byte("bodies")  // key -> request body, while pending
	metaFormatKey = []byte("format")
	metaFormat    = []byte("idem-journal/1")
)

// BoltStore is the durable KeyStore: a bbolt file journal with group commit.
// It is safe for concurrent use.
//
// Reserve, Acquire and Renew are committed together with every other change queued
// while the previous commit ran (one transaction and one fsync per group)
// and return only once their own commit is durable. Attempt and Finish are
// queued into the same writer and return at once: their change rides the
// next commit. Get, Pending and Claim wait for queued changes first, so a
// reader always sees its own writes. Close commits everything queued.
//
// Leases are kept as the KeyStore contract says, with one addition: the
// file lock proves that no other process uses the journal, so a lease left
// by an earlier process has lapsed as soon as the file is opened again.
//
// After a crash, every Reserve and Acquire that returned is in the file;
// transactions that had not finished committing are rolled back by bbolt.
type BoltStore struct {
	db     *bolt.DB
	file   *os.File    // bbolt's file handle, to release a broken journal
	broken atomic.Bool // bbolt panicked or faulted; its locks may be held
	w      *groupcommit.Writer[*bolt.Tx]
	log    *slog.Logger
	o      BoltOptions
	closed atomic.Bool
	now    func() time.Time

	// owners are the lease owners seen since the file was opened. The file
	// lock proves that no other process uses the journal, so a lease held
	// by any other owner was left by a process that is gone: it has lapsed.
	owners sync.Map
}

var _ KeyStore = (*BoltStore)(nil)

// OpenBoltStore opens the journal at path, creating the file (mode 0600) if
// it does not exist.
// It returns an error matching ErrJournalLocked if another process or handle
// holds the file for longer than o.LockTimeout, ErrJournalCorrupt for a
// damaged, truncated or foreign file, and ErrJournalWrite if the file cannot
// be opened for writing.
func OpenBoltStore(path string, o *BoltOptions) (*BoltStore, error) {
	var opt BoltOptions
	if o != nil {
		opt = *o
	}
	if opt.LockTimeout <= 0 {
		opt.LockTimeout = defaultLockTimeout
	}
	if opt.MaxGroup <= 0 {
		opt.MaxGroup = defaultMaxGroup
	}
	s := &BoltStore{o: opt, log: opt.Logger, now: time.Now}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	db, err := s.openBolt(path, opt.LockTimeout)
	if err != nil {
		return nil, err
	}
	s.db = db
	if err := s.init(); err != nil {
		_ = s.release()
		return nil, fmt.Errorf("open journal %s: %w", path, err)
	}
	s.w = groupcommit.New(s.update, groupcommit.Options{
		MaxGroup: opt.MaxGroup,
		OnAsyncError: func(err error) {
			s.log.Warn("idem: queued journal change lost", "err", err)
		},
	})
	return s, nil
}

// openBolt opens the bbolt file and maps its errors to idem's sentinels. A
// damaged file can make bbolt panic or fault on its memory map; both are
// turned into ErrJournalCorrupt.
func (s *BoltStore) openBolt(path string, timeout time.Duration) (db *bolt.DB, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			if s.file != nil {
				_ = s.file.Close()
			}
			db, err = nil, fmt.Errorf("open journal %s: %w: %v", path, ErrJournalCorrupt, p)
		}
	}()
	db, err = bolt.Open(path, 0o600, &bolt.Options{
		Timeout:      timeout,
		FreelistType: bolt.FreelistMapType,
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			f, err := os.OpenFile(name, flag, perm)
			s.file = f
			return f, err
		},
	})
	if err != nil {
		return nil, fmt.Errorf("open journal %s: %w", path, mapOpenError(err))
	}
	return db, nil
}

// release closes the bbolt file. After bbolt panicked its locks may be
// held, so DB.Close would block forever: then only the file is closed,
// which releases the lock on it, and the memory map is left behind.
func (s *BoltStore) release() error {
	if s.broken.Load() {
		return s.file.Close()
	}
	return s.db.Close()
}

func mapOpenError(err error) error {
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return fmt.Errorf("%w: %w", ErrJournalLocked, err)
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum),
		errors.Is(err, berrors.ErrVersionMismatch), errors.Is(err, berrors.ErrInvalidMapping):
		return fmt.Errorf("%w: %w", ErrJournalCorrupt, err)
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		return fmt.Errorf("%w: %w", ErrJournalWrite, err)
	}
	// bbolt reports most damage (a file shorter than its pages, a bad
	// page) with plain errors; anything else from opening an existing file
	// is damage too.
	return fmt.Errorf("%w: %w", ErrJournalCorrupt, err)
}

// init checks the format marker and creates the buckets of a new journal.
// A bbolt file with other buckets and no marker is foreign.
func (s *BoltStore) init() error {
	fi, err := s.file.Stat()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrJournalCorrupt, err)
	}
	// A file shorter than the pages its meta page claims was truncated;
	// reading those pages would fault.
	err = s.view(func(tx *bolt.Tx) error {
		if fi.Size() < tx.Size() {
			return fmt.Errorf("%w: file is %d bytes, its pages need %d (truncated)", ErrJournalCorrupt, fi.Size(), tx.Size())
		}
		return nil
	})
	if err != nil {
		return err
	}
	return s.update(func(tx *bolt.Tx) error {
		if m := tx.Bucket(bucketMeta); m != nil {
			if f := m.Get(metaFormatKey); !bytes.Equal(f, metaFormat) {
				return fmt.Errorf("%w: journal format %q, want %q", ErrJournalCorrupt, f, metaFormat)
			}
		} else {
			foreign := false
			_ = tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
				foreign = true
				return errors.New("stop")
			})
			if foreign {
				return fmt.Errorf("%w: not an idem journal (no format marker)", ErrJournalCorrupt)
			}
			m, err := tx.CreateBucket(bucketMeta)
			if err != nil {
				return err
			}
			if err := m.Put(metaFormatKey, metaFormat); err != nil {
				return err
			}
		}
		for _, name := range [][]byte{bucketOps, bucketNames, bucketPending, bucketDone, bucketBodies} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return fmt.Errorf("%w: bucket %s: %w", ErrJournalCorrupt, name, err)
			}
		}
		return nil
	})
}

// guarded runs f with a fault or panic inside bbolt (a damaged page)
// turned into ErrJournalCorrupt; after one, the store refuses all access.
func (s *BoltStore) guarded(f func() error) (err error) {
	if s.broken.Load() {
		return fmt.Errorf("%w: an earlier access failed", ErrJournalCorrupt)
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			s.broken.Store(true)
			err = fmt.Errorf("%w: %v", ErrJournalCorrupt, p)
		}
	}()
	return f()
}

// update runs fn in one durable bbolt transaction, guarded; a failed
// commit becomes ErrJournalWrite.
func (s *BoltStore) update(fn func(*bolt.Tx) error) error {
	return s.guarded(func() error {
		var fnErr error
		err := s.db.Update(func(tx *bolt.Tx) error {
			fnErr = fn(tx)
			return fnErr
		})
		if err != nil && fnErr == nil {
			return fmt.Errorf("%w: %w", ErrJournalWrite, err)
		}
		return err
	})
}

// view runs fn in a read transaction, guarded.
func (s *BoltStore) view(fn func(*bolt.Tx) error) error {
	return s.guarded(func() error {
		err := s.db.View(fn)
		if errors.Is(err, berrors.ErrDatabaseNotOpen) {
			return ErrClosed
		}
		return err
	})
}

// write commits fn durably, in a group with other writers.
func (s *BoltStore) write(ctx context.Context, fn func(*bolt.Tx) error) error {
	if s.o.perWrite {
		if err := ctx.Err(); err != nil {
			return err
		}
		return s.update(fn)
	}
	return closedErr(s.w.Do(ctx, fn))
}

// writeAsync queues fn for the next commit and returns at once.
func (s *BoltStore) writeAsync(fn func(*bolt.Tx) error) error {
	if s.o.perWrite {
		return s.update(fn)
	}
	return closedErr(s.w.Go(fn))
}

// settle waits until every change queued so far has committed, so a read
// sees the caller's own Attempt and Finish.
func (s *BoltStore) settle(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return ErrClosed
	}
	if s.o.perWrite {
		return nil
	}
	return closedErr(s.w.Sync(ctx))
}

func closedErr(err error) error {
	if errors.Is(err, groupcommit.ErrClosed) {
		return ErrClosed
	}
	return err
}

func (s *BoltStore) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return ErrClosed
	}
	return nil
}

// buckets are the journal's buckets within one transaction.
type buckets struct {
	ops, names, pending, done, bodies *bolt.Bucket
}

func bucketsOf(tx *bolt.Tx) (buckets, error) {
	b := buckets{
		ops: tx.Bucket(bucketOps), names: tx.Bucket(bucketNames),
		pending: tx.Bucket(bucketPending), done: tx.Bucket(bucketDone), bodies: tx.Bucket(bucketBodies),
	}
	if b.ops == nil || b.names == nil || b.pending == nil || b.done == nil || b.bodies == nil {
		return b, fmt.Errorf("%w: a bucket is missing", ErrJournalCorrupt)
	}
	return b, nil
}

// timeKey returns the index key for t and key: t in Unix nanoseconds as
// 8 bytes big-endian with the sign bit flipped (so the order of bytes is
// the order of times), then key.
func timeKey(ns int64, key string) []byte {
	k := make([]byte, 8+len(key))
	binary.BigEndian.PutUint64(k, uint64(ns)^(1<<63))
	copy(k[8:], key)
	return k
}

func timeOf(k []byte) int64 { return int64(binary.BigEndian.Uint64(k) ^ (1 << 63)) }

func toNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNanos(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// Record flags.
const (
	flagRedacted     = 1 << 0
	flagUnreplayable = 1 << 1
)

func toRecord(op *Operation) codec.Record {
	var flags uint8
	if op.Redacted {
		flags |= flagRedacted
	}
	if op.Unreplayable {
		flags |= flagUnreplayable
	}
	return codec.Record{
		Key: op.Key, Name: op.Name, Method: op.Method, URL: op.URL, Host: op.Host,
		Fingerprint: op.Fingerprint, State: uint8(op.State), Flags: flags,
		Attempts: int64(op.Attempts), LastStatus: int64(op.LastStatus), LastError: op.LastError,
		Created: toNanos(op.Created), Updated: toNanos(op.Updated), LeaseUntil: toNanos(op.LeaseUntil),
		Owner: op.Owner, Header: op.Header,
	}
}

func fromRecord(r *codec.Record) Operation {
	return Operation{
		Key: r.Key, Name: r.Name, Method: r.Method, URL: r.URL, Host: r.Host,
		Fingerprint: r.Fingerprint, State: State(r.State),
		Redacted: r.Flags&flagRedacted != 0, Unreplayable: r.Flags&flagUnreplayable != 0,
		Attempts: int(r.Attempts), LastStatus: int(r.LastStatus), LastError: r.LastError,
		Created: fromNanos(r.Created), Updated: fromNanos(r.Updated), LeaseUntil: fromNanos(r.LeaseUntil),
		Owner: r.Owner, Header: http.Header(r.Header),
	}
}

// decode reads the record stored under key into r, mapping codec errors to
// ErrRecordVersion and ErrJournalCorrupt.
func decode(key string, v []byte, r *codec.Record) error {
	if err := codec.Decode(v, r); err != nil {
		if errors.Is(err, codec.ErrVersion) {
			return fmt.Errorf("record %s: %w: %w", key, ErrRecordVersion, err)
		}
		return fmt.Errorf("record %s: %w: %w", key, ErrJournalCorrupt, err)
	}
	return nil
}

// load returns the record for key with its body, or ErrNotFound.
func load(b buckets, key string) (codec.Record, error) {
	var r codec.Record
	v := b.ops.Get([]byte(key))
	if v == nil {
		return r, fmt.Errorf("%s: %w", key, ErrNotFound)
	}
	return r, decode(key, v, &r)
}

func loadOp(b buckets, key string) (Operation, error) {
	r, err := load(b, key)
	if err != nil {
		return Operation{}, err
	}
	op := fromRecord(&r)
	if body := b.bodies.Get([]byte(key)); body != nil {
		op.Body = bytes.Clone(body)
	}
	return op, nil
}

// put stores rec, replacing old (nil for a new record), and keeps the
// pending and done indexes in step with the state.
func put(b buckets, old, rec *codec.Record) error {
	if old != nil {
		if State(old.State) == StatePending {
			if err := b.pending.Delete([]byte(old.Key)); err != nil {
				return err
			}
		} else if State(old.State).Finished() {
			if err := b.done.Delete(timeKey(old.Updated, old.Key)); err != nil {
				return err
			}
		}
	}
	if err := b.ops.Put([]byte(rec.Key), codec.Encode(rec)); err != nil {
		return err
	}
	if State(rec.State) == StatePending {
		return b.pending.Put([]byte(rec.Key), nil)
	}
	if State(rec.State).Finished() {
		return b.done.Put(timeKey(rec.Updated, rec.Key), nil)
	}
	return nil
}

// Reserve implements KeyStore. It returns once the new record is durable.
func (s *BoltStore) Reserve(ctx context.Context, op Operation) (Operation, bool, error) {
	if err := s.check(ctx); err != nil {
		return Operation{}, false, err
	}
	if err := CheckKey(op.Key); err != nil {
		return Operation{}, false, err
	}
	newRecord(&op, s.now())
	s.seen(op.Owner)
	rec := toRecord(&op)
	enc := codec.Encode(&rec)
	key := []byte(op.Key)
	body := op.Body
	if op.State != StatePending {
		body = nil
	}

	var (
		existing Operation
		created  bool
	)
	err := s.write(ctx, func(tx *bolt.Tx) error {
		created = false
		b, err := bucketsOf(tx)
		if err != nil {
			return err
		}
		if op.Name != "" {
			if k := b.names.Get([]byte(op.Name)); k != nil {
				existing, err = loadOp(b, string(k))
				if errors.Is(err, ErrNotFound) {
					err = fmt.Errorf("%w: name %q points to missing record %s", ErrJournalCorrupt, op.Name, k)
				}
				return err
			}
		}
		if b.ops.Get(key) != nil {
			existing, err = loadOp(b, op.Key)
			return err
		}
		if err := b.ops.Put(key, enc); err != nil {
			return err
		}
		if op.Name != "" {
			if err := b.names.Put([]byte(op.Name), key); err != nil {
				return err
			}
		}
		if op.State == StatePending {
			err = b.pending.Put(key, nil)
		} else if op.State.Finished() {
			err = b.done.Put(timeKey(rec.Updated, op.Key), nil)
		}
		if err != nil {
			return err
		}
		if len(body) > 0 {
			if err := b.bodies.Put(key, body); err != nil {
				return err
			}
		}
		created = true
		return nil
	})
	if err != nil {
		return Operation{}, false, fmt.Errorf("reserve %s: %w", op.Key, err)
	}
	if !created {
		return existing, false, nil
	}
	op.Body = body // op.Header is shared with the caller, as Reserve's contract allows
	op.Created, op.Updated = fromNanos(rec.Created), fromNanos(rec.Updated)
	return op, true, nil
}

// seen records owner as a lease owner of this session.
func (s *BoltStore) seen(owner string) {
	if owner != "" {
		s.owners.LoadOrStore(owner, struct{}{})
	}
}

// heldByOther is Lease.heldByOther, with leases of owners not seen since
// the file was opened lapsed.
func (s *BoltStore) heldByOther(l Lease, r *codec.Record) bool {
	op := Operation{Owner: r.Owner, LeaseUntil: fromNanos(r.LeaseUntil)}
	if !l.heldByOther(&op) {
		return false
	}
	_, live := s.owners.Load(r.Owner)
	return live
}

// Acquire implements KeyStore. It returns once the change is durable.
func (s *BoltStore) Acquire(ctx context.Context, key string, l Lease, header http.Header, body []byte) (Operation, error) {
	if err := s.check(ctx); err != nil {
		return Operation{}, err
	}
	s.seen(l.Owner)
	now := toNanos(s.now())
	var op Operation
	err := s.write(ctx, func(tx *bolt.Tx) error {
		b, err := bucketsOf(tx)
		if err != nil {
			return err
		}
		old, err := load(b, key)
		if err != nil {
			return err
		}
		pending := State(old.State) == StatePending
		if pending && s.heldByOther(l, &old) {
			return fmt.Errorf("leased to %q: %w", old.Owner, ErrInProgress)
		}
		rec := old
		rec.Owner, rec.LeaseUntil, rec.Updated = l.Owner, toNanos(l.Until), now
		if !pending {
			rec.State = uint8(StatePending)
			rec.Header = header
			if len(body) > 0 {
				err = b.bodies.Put([]byte(key), body)
			} else {
				err = b.bodies.Delete([]byte(key))
			}
			if err != nil {
				return err
			}
		}
		if err := put(b, &old, &rec); err != nil {
			return err
		}
		op = fromRecord(&rec)
		if pending {
			if v := b.bodies.Get([]byte(key)); v != nil {
				op.Body = bytes.Clone(v)
			}
		} else {
			op.Body = body
		}
		return nil
	})
	if err != nil {
		return Operation{}, fmt.Errorf("acquire %q: %w", key, err)
	}
	op.Header = op.Header.Clone()
	return op, nil
}

// Renew implements KeyStore. It returns once the change is durable.
func (s *BoltStore) Renew(ctx context.Context, key string, l Lease) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	err := s.write(ctx, func(tx *bolt.Tx) error {
		b, err := bucketsOf(tx)
		if err != nil {
			return err
		}
		old, err := load(b, key)
		if err != nil {
			return err
		}
		if State(old.State) != StatePending || old.Owner != l.Owner {
			return ErrLeaseLost
		}
		rec := old
		rec.LeaseUntil = toNanos(l.Until)
		return put(b, &old, &rec)
	})
	if err != nil {
		return fmt.Errorf("renew %q: %w", key, err)
	}
	return nil
}

// Get implements KeyStore.
func (s *BoltStore) Get(ctx context.Context, key string) (Operation, error) {
	if err := s.settle(ctx); err != nil {
		return Operation{}, err
	}
	var op Operation
	err := s.view(func(tx *bolt.Tx) error {
		b, err := bucketsOf(tx)
		if err != nil {
			return err
		}
		op, err = loadOp(b, key)
		return err
	})
	if err != nil {
		return Operation{}, fmt.Errorf("get %q: %w", key, err)
	}
	return op, nil
}

// Named returns the record for an operation name, or an error matching
// ErrNotFound.
func (s *BoltStore) Named(ctx context.Context, name string) (Operation, error) {
	if err := s.settle(ctx); err != nil {
		return Operation{}, err
	}
	var key []byte
	err := s.view(func(tx *bolt.Tx) error {
		b, err := bucketsOf(tx)
		if err != nil {
			return err
		}
		if key = bytes.Clone(b.names.Get([]byte(name))); key == nil {
			return fmt.Errorf("operation %q: %w", name, ErrNotFound)
		}
		return nil
	})
	if err != nil {
		return Operation{}, err
	}
	return s.Get(ctx, string(key))
}

// Attempt implements KeyStore. The change is queued for the next commit;
// Attempt returns an error at once only if the record does not exist or
// cannot be read.
func (s *BoltStore) Attempt(ctx context.Context, key string, a Attempt) error {
	return s.change(ctx, "attempt", key, func(r *codec.Record) {
		r.Attempts += int64(max(a.Sent, 0))
		r.LastStatus, r.LastError = int64(a.Status), a.Err
	}, false)
}

// Finish implements KeyStore. The change, which also deletes the stored
// body, is queued for the next commit; Finish returns an error at once only
// if o.State is not final or the record does not exist or cannot be read.
func (s *BoltStore) Finish(ctx context.Context, key string, o Outcome) error {
	if !o.State.Finished() {
		return fmt.Errorf("idem: finish %q: state %s is not final", key, o.State)
	}
	return s.change(ctx, "finish", key, func(r *codec.Record) {
		r.State = uint8(o.State)
		r.Attempts += int64(max(o.Sent, 0))
		r.LastStatus, r.LastError = int64(o.Status), o.Err
		r.Header = nil
		r.LeaseUntil = 0
		r.URL = withoutQuery(r.URL)
	}, true)
}

// change queues fn's change to the record for key. It first checks, in a
// read transaction, that the record exists and has a version this code can
// rewrite, so the caller hears of those errors.
func (s *BoltStore) change(ctx context.Context, what, key string, fn func(*codec.Record), dropBody bool) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	err := s.view(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketOps).Get([]byte(key))
		switch {
		case v == nil:
			return fmt.Errorf("%q: %w", key, ErrNotFound)
		case v[0] != codec.Version:
			return fmt.Errorf("record %q: %w: version %d", key, ErrRecordVersion, v[0])
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	now := toNanos(s.now())
	err = s.writeAsync(func(tx *bolt.Tx) error {
		b, err := bucketsOf(tx)
		if err != nil {
			return err
		}
		old, err := load(b, key)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		rec := old
		fn(&rec)
		rec.Updated = now
		if err := put(b, &old, &rec); err != nil {
			return err
		}
		if dropBody {
			return b.bodies.Delete([]byte(key))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s %q: %w", what, key, err)
	}
	return nil
}

// Pending implements KeyStore. It walks the pending index, ordered by key,
// from after; it does not scan the journal.
func (s *BoltStore) Pending(ctx context.Context, after string, limit int) ([]Operation, error) {
	if err := s.settle(ctx); err != nil {
		return nil, err
	}
	var (
		ops  []Operation
		errs []error
	)
	err := s.view(func(tx *bolt.Tx) error {
		ops, errs = nil, nil
		return s.walkPending(tx, after, limit, func(op Operation, err error) {
			if err != nil {
				errs = append(errs, err)
			}
			ops = append(ops, op)
		})
	})
	if err != nil {
		return nil, fmt.Errorf("pending: %w", err)
	}
	return ops, errors.Join(errs...)
}

// Claim implements KeyStore. It returns once the leases are durable.
func (s *BoltStore) Claim(ctx context.Context, l Lease, after string, limit int) ([]Operation, error) {
	if err := s.settle(ctx); err != nil {
		return nil, err
	}
	s.seen(l.Owner)
	var (
		ops  []Operation
		errs []error
	)
	err := s.write(ctx, func(tx *bolt.Tx) error {
		ops, errs = nil, nil
		b, err := bucketsOf(tx)
		if err != nil {
			return err
		}
		err = s.walkPending(tx, after, 0, func(op Operation, err error) {
			if limit > 0 && len(ops) >= limit {
				return
			}
			if err != nil {
				errs = append(errs, err)
				ops = append(ops, op)
				return
			}
			r := toRecord(&op)
			if s.heldByOther(l, &r) {
				return
			}
			ops = append(ops, op)
		})
		if err != nil {
			return err
		}
		for i := range ops {
			if ops[i].State != StatePending {
				continue
			}
			old, err := load(b, ops[i].Key)
			if err != nil {
				return err
			}
			rec := old
			rec.Owner, rec.LeaseUntil = l.Owner, toNanos(l.Until)
			if err := put(b, &old, &rec); err != nil {
				return err
			}
			ops[i].Owner, ops[i].LeaseUntil = l.Owner, l.Until
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	return ops, errors.Join(errs...)
}

// walkPending calls fn for up to limit pending records after after, in key
// order. A record it cannot read is passed with only its key and the error.
func (s *BoltStore) walkPending(tx *bolt.Tx, after string, limit int, fn func(Operation, error)) error {
	b, err := bucketsOf(tx)
	if err != nil {
		return err
	}
	c := b.pending.Cursor()
	k, _ := c.Seek([]byte(after))
	if after != "" && string(k) == after {
		k, _ = c.Next()
	}
	for n := 0; k != nil && (limit <= 0 || n < limit); k, _ = c.Next() {
		key := string(k)
		op, err := loadOp(b, key)
		if err != nil {
			err = fmt.Errorf("pending record %q: %w", key, err)
			fn(Operation{Key: key, LastError: err.Error()}, err)
			n++
			continue
		}
		if op.State != StatePending {
			continue
		}
		fn(op, nil)
		n++
	}
	return nil
}

// Sweep implements KeyStore. It walks the index of finished records,
// ordered by last change, up to cutoff, and deletes them in commits of at
// most 1000 records. Records it cannot read are kept.
func (s *BoltStore) Sweep(ctx context.Context, cutoff time.Time) (int, error) {
	if err := s.check(ctx); err != nil {
		return 0, err
	}
	total := 0
	limit := timeKey(cutoff.UnixNano(), "")
	var from []byte // where the next chunk starts
	for {
		n, more := 0, false
		err := s.write(ctx, func(tx *bolt.Tx) error {
			n, more = 0, false
			b, err := bucketsOf(tx)
			if err != nil {
				return err
			}
			var idx [][]byte
			c := b.done.Cursor()
			k, _ := c.First()
			if from != nil {
				k, _ = c.Seek(from)
			}
			for ; k != nil && bytes.Compare(k, limit) < 0; k, _ = c.Next() {
				if len(idx) == sweepChunk {
					more = true
					break
				}
				idx = append(idx, bytes.Clone(k))
			}
			if more {
				from = append(bytes.Clone(idx[len(idx)-1]), 0)
			}
			for _, k := range idx {
				if err := b.done.Delete(k); err != nil {
					return err
				}
				if len(k) < 8 {
					continue
				}
				key := k[8:]
				r, err := load(b, string(key))
				if errors.Is(err, ErrNotFound) {
					continue
				}
				if err != nil || !State(r.State).Finished() || r.Updated != timeOf(k) {
					// Unreadable or changed since it was indexed: keep
					// the record (its current index entry, if any, stays).
					if err != nil {
						s.log.Warn("idem: sweep kept unreadable record", "key", string(key), "err", err)
						if err := b.done.Put(k, nil); err != nil {
							return err
						}
					}
					continue
				}
				if r.Name != "" && bytes.Equal(b.names.Get([]byte(r.Name)), key) {
					if err := b.names.Delete([]byte(r.Name)); err != nil {
						return err
					}
				}
				if err := b.ops.Delete(key); err != nil {
					return err
				}
				if err := b.bodies.Delete(key); err != nil {
					return err
				}
				n++
			}
			return nil
		})
		if err != nil {
			return total, fmt.Errorf("sweep: %w", err)
		}
		total += n
		if !more {
			return total, nil
		}
	}
}

// Close commits every queued change, makes it durable and closes the file.
// Later calls of any method, Close included, return ErrClosed.
func (s *BoltStore) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return ErrClosed
	}
	var werr error
	if s.w != nil {
		werr = closedErr(s.w.Close())
	}
	return errors.Join(werr, s.release())
}
