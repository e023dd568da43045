// The scratch that the changes of one write transaction of the bbolt
// journal share, and the changes that are reused once committed.

package boltjournal

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/idemgo/idem/idemstore"
	"github.com/idemgo/idem/internal/codec"
	bolt "go.etcd.io/bbolt"
)

// txScratch is what the changes of one write transaction share: a cursor
// on its ops bucket for their reads (a Get makes a cursor of its own, and
// its stack, each time), a record to decode into, and a buffer their new
// values are cut from. bbolt keeps a reference to a value put until its
// transaction ends, so the buffer is reused by a later transaction only;
// write transactions run one at a time (bbolt's writer lock orders them),
// and the scratch is used only inside them.
type txScratch struct {
	tx  *bolt.Tx // the transaction it serves; held, so no other has its address
	cur *bolt.Cursor
	rec codec.Record
	buf []byte
	// done lists the finish marks this transaction ran, for reuse once
	// it has committed; nil until one ran.
	done *committedMarks
}

// scratchMax bounds the buffer kept between transactions; a larger value
// gets a buffer of its own.
const scratchMax = 64 << 10

// begin makes the scratch serve tx, whose ops bucket is ops.
func (sc *txScratch) begin(tx *bolt.Tx, ops *bolt.Bucket) {
	if sc.tx == tx {
		return
	}
	sc.tx, sc.cur, sc.buf, sc.done = tx, ops.Cursor(), sc.buf[:0], nil
}

// get returns the value of key in the ops bucket, as Bucket.Get does.
func (sc *txScratch) get(key []byte) []byte {
	k, v := sc.cur.Seek(key)
	if !bytes.Equal(k, key) {
		return nil
	}
	return v
}

// value returns an empty slice of capacity n for a value to put, cut from
// the buffer.
func (sc *txScratch) value(n int) []byte {
	if n > scratchMax/4 {
		return make([]byte, 0, n)
	}
	if cap(sc.buf)-len(sc.buf) < n {
		// The values cut from the old buffer keep it alive while bbolt
		// holds them.
		sc.buf = make([]byte, 0, min(max(2*cap(sc.buf), 4*n, 512), scratchMax))
	}
	at := len(sc.buf)
	sc.buf = sc.buf[:at+n]
	return sc.buf[at : at : at+n]
}

// change is Store.change: the record's new value is cut from the
// buffer, and it is read through the cursor.
func (sc *txScratch) change(ops *bolt.Bucket, key string, fn func(r *codec.Record, req []byte) ([]byte, error)) error {
	sc.begin(ops.Tx(), ops)
	k := unsafe.Slice(unsafe.StringData(key), len(key))
	v := sc.get(k)
	if v == nil {
		return fmt.Errorf("%q: %w", key, idemstore.ErrNotFound)
	}
	r := &sc.rec
	defer func() { *r = codec.Record{} }() // it aliases tx memory
	req, err := codec.DecodeHeadAlias(v, r)
	if err != nil {
		return codecErr(key, err)
	}
	if req, err = fn(r, req); err != nil {
		if err == errUnchanged {
			return nil
		}
		return err
	}
	buf := sc.value(codec.HeadSize(r) + max(len(req), 1))
	return ops.Put(k, codec.AppendWithRequest(buf, r, req))
}

// finishMark is one Finish's change, queued for the next commit. Marks
// are reused: a mark runs until a transaction it ran in commits (after a
// failed commit the group commit runs it again), and that transaction's
// commit hands it back (txScratch.ranMark).
type finishMark struct {
	s   *Store
	key string
	o   idemstore.Outcome
	now int64
	fn  func(*bolt.Tx) error // apply, made once per mark
}

// finishMarks and committedLists hold the marks and lists free for
// reuse. (Their New functions are set by init: a mark's commit hands it
// back through a list, a cycle a variable's initializer may not have.)
var finishMarks, committedLists sync.Pool

func init() {
	finishMarks.New = func() any {
		m := new(finishMark)
		m.fn = m.apply
		return m
	}
	committedLists.New = func() any {
		c := new(committedMarks)
		c.fn = c.release
		return c
	}
}

// errUnchanged is what a change's fn returns to leave the record as it
// is: change then writes nothing and returns nil.
var errUnchanged = errors.New("idem: record unchanged")

// heldBy reports whether a mark made for owner applies to r: r is pending
// and owner holds it, or owner is "" (KeyStore.Attempt).
func heldBy(r *codec.Record, owner string) bool {
	return owner == "" || idemstore.State(r.State) == idemstore.StatePending && r.Owner == owner
}

func newFinishMark(s *Store, key string, o idemstore.Outcome) *finishMark {
	m := finishMarks.Get().(*finishMark)
	m.s, m.key, m.o, m.now = s, key, o, toNanos(o.At)
	return m
}

func (m *finishMark) apply(tx *bolt.Tx) error {
	s := m.s
	ops, err := opsOf(tx)
	if err != nil {
		return err
	}
	apart := false
	err = s.change(ops, m.key, func(r *codec.Record, req []byte) ([]byte, error) {
		if !heldBy(r, m.o.Owner) {
			return req, errUnchanged // its owner lost the record
		}
		r.State = uint8(m.o.State)
		r.Attempts += int64(m.o.Sent)
		r.LastStatus, r.LastError, r.URL = int64(m.o.Status), m.o.Err, m.o.URL
		r.LeaseUntil = 0
		r.Updated = m.now
		apart = r.Flags&flagBodyApart != 0
		r.Flags &^= flagBodyApart
		if len(req) > 1 || apart {
			s.f.noteDrop(tx)
		}
		return nil, nil
	})
	if err != nil {
		return fmt.Errorf("finish: %w", err)
	}
	if apart {
		if err := ops.Delete(bodyKey(m.key)); err != nil {
			return err
		}
	}
	s.scratch.ranMark(tx, m)
	return nil
}

// ranMark notes that mark m ran in tx, so that tx's commit hands it back
// for reuse. The scratch serves tx (change began it).
func (sc *txScratch) ranMark(tx *bolt.Tx, m *finishMark) {
	if sc.done == nil {
		sc.done = committedLists.Get().(*committedMarks)
		tx.OnCommit(sc.done.fn)
	}
	sc.done.marks = append(sc.done.marks, m)
}

// committedMarks are the finish marks one transaction ran. Its commit
// handler puts them back; bbolt runs it after the transaction let go of
// the writer's lock, so it touches nothing but the list.
type committedMarks struct {
	marks []*finishMark
	fn    func() // release, made once per list
}

func (c *committedMarks) release() {
	for i, m := range c.marks {
		*m = finishMark{fn: m.fn}
		finishMarks.Put(m)
		c.marks[i] = nil
	}
	c.marks = c.marks[:0]
	committedLists.Put(c)
}
