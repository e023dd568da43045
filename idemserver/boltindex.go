package idemserver

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	bolt "go.etcd.io/bbolt"

	"github.com/idemgo/idem/idemstore"
	"github.com/idemgo/idem/internal/codec"
)

// The index of stored keys. On disk, the bucket index holds one entry per
// expiry and hash of an id: 16 bytes of key (the expiry as the records
// bucket orders it, then idHash of the id, both big-endian) and a count
// of the records under them (a uvarint, 1 unless two ids share a hash and
// an expiry). It is written in the transaction that writes or deletes
// the records, in the same expiry order, so a group commit's entries are
// neighbours too. Open reads it, not the records: 32 bytes per key in
// the file, against a few hundred for a record with its answer.
//
// In memory, keyIndex maps the hash of an id to the expiry of its record:
// 16 bytes a slot. A hash is not an id: two ids may share one. The index
// is a multiset of (hash, expiry) pairs, exact as the file's; a key it
// does not hold has no record (no read needed), and a key it holds is
// read at each expiry the index gives for its hash until its own record
// is found.

// bucketIndex is the index bucket of format 4.
var bucketIndex = []byte("index")

// idHash returns the 64-bit FNV-1a hash of id, as the index keys it.
func idHash(id string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(id); i++ {
		h ^= uint64(id[i])
		h *= 1099511628211
	}
	return h
}

// indexKey returns the index bucket's key of a record expiring at exp of
// an id hashing to h.
// It has room for the entry's value after it, so that one allocation
// holds both (bbolt keeps both until the transaction ends).
func indexKey(exp, h uint64) []byte {
	k := make([]byte, 16, 16+binary.MaxVarintLen64)
	binary.BigEndian.PutUint64(k, exp)
	binary.BigEndian.PutUint64(k[8:], h)
	return k
}

// indexAdd counts one more record under (exp, h) in the index bucket b.
func indexAdd(b *bolt.Bucket, exp, h uint64) error {
	k := indexKey(exp, h)
	n, _ := binary.Uvarint(b.Get(k))
	return b.Put(k, binary.AppendUvarint(k[16:], n+1))
}

// indexSub counts one record less under (exp, h) in the index bucket b.
func indexSub(b *bolt.Bucket, exp, h uint64) error {
	k := indexKey(exp, h)
	n, _ := binary.Uvarint(b.Get(k))
	if n <= 1 {
		return b.Delete(k)
	}
	return b.Put(k, binary.AppendUvarint(k[16:], n-1))
}

// manyExpiries marks, in keyIndex.m, a hash with more than one record:
// its expiries are in keyIndex.multi. No record expires at it (expiries
// are at most math.MaxInt64).
const manyExpiries = math.MaxUint64

// keyIndex is the index of stored keys in memory (see bucketIndex); a
// flights' mu guards it.
type keyIndex struct {
	m        map[uint64]uint64   // hash -> expiry, or manyExpiries
	draining map[uint64]uint64   // an earlier m, moved into m a step at a time
	multi    map[uint64][]uint64 // hash -> its expiries, for hashes with more than one record
	// gone counts the (hash, expiry) pairs a sweep deleted from the file
	// before their Complete indexed them (a record that expired while it
	// committed): that Complete's add consumes the pair instead.
	gone map[[2]uint64]int
	n    int // the records indexed
	peak int // the most records indexed since m was made
}

// The index is rebuilt smaller once it has fallen under half its peak,
// if that peak was at least minShrink keys: a Go map keeps its buckets
// after deletes. The keys move into the new map drainStep at a time per
// sweep transaction (and a few per Complete), so that no request waits
// behind a copy of the whole index.
const (
	minShrink  = 1024
	drainStep  = 4096
	drainOnAdd = 8
)

func (x *keyIndex) get(h uint64) (uint64, bool) {
	if v, ok := x.m[h]; ok {
		return v, ok
	}
	v, ok := x.draining[h]
	return v, ok
}

func (x *keyIndex) put(h, v uint64) {
	if x.m == nil {
		x.m = make(map[uint64]uint64)
	}
	if x.draining != nil {
		delete(x.draining, h)
		x.drain(drainOnAdd)
	}
	x.m[h] = v
}

func (x *keyIndex) del(h uint64) {
	delete(x.m, h)
	delete(x.draining, h)
}

// expiries appends to buf the expiries of the records whose id hashes to h.
func (x *keyIndex) expiries(h uint64, buf []uint64) []uint64 {
	v, ok := x.get(h)
	switch {
	case !ok:
		return buf
	case v == manyExpiries:
		return append(buf, x.multi[h]...)
	}
	return append(buf, v)
}

// add indexes a record of an id hashing to h, expiring at exp, unless a
// sweep already deleted it.
func (x *keyIndex) add(h, exp uint64) {
	if n := x.gone[[2]uint64{h, exp}]; n > 0 {
		if n == 1 {
			delete(x.gone, [2]uint64{h, exp})
		} else {
			x.gone[[2]uint64{h, exp}] = n - 1
		}
		return
	}
	v, ok := x.get(h)
	switch {
	case !ok:
		x.put(h, exp)
	case v == manyExpiries:
		x.multi[h] = append(x.multi[h], exp)
	default:
		if x.multi == nil {
			x.multi = make(map[uint64][]uint64)
		}
		x.put(h, manyExpiries)
		x.multi[h] = []uint64{v, exp}
	}
	x.n++
	x.peak = max(x.peak, x.n)
}

// remove takes a record of an id hashing to h, expiring at exp, out of
// the index, and reports whether the index held one.
func (x *keyIndex) remove(h, exp uint64) bool {
	v, ok := x.get(h)
	switch {
	case !ok:
		return false
	case v == manyExpiries:
		es := x.multi[h]
		i := slices.Index(es, exp)
		if i < 0 {
			return false
		}
		if es = slices.Delete(es, i, i+1); len(es) == 1 {
			x.put(h, es[0])
			delete(x.multi, h)
		} else {
			x.multi[h] = es
		}
	case v != exp:
		return false
	default:
		x.del(h)
	}
	x.n--
	return true
}

// sweptUnindexed records that a sweep deleted a record the index does
// not hold yet: its Complete is between its commit and its add.
func (x *keyIndex) sweptUnindexed(h, exp uint64) {
	if x.gone == nil {
		x.gone = make(map[[2]uint64]int)
	}
	if len(x.gone) < maxGone {
		x.gone[[2]uint64{h, exp}]++
	}
}

// maxGone bounds keyIndex.gone; past it, a record swept while it
// committed leaves an entry in the index that no record matches (read
// once by a Begin of its key, never replayed).
const maxGone = 1024

// shrink starts a rebuild of m smaller once it holds under half its peak,
// and moves a step of keys into it if one is under way.
func (x *keyIndex) shrink() {
	if x.draining == nil && x.peak >= minShrink && x.n < x.peak/2 {
		x.draining, x.m, x.peak = x.m, make(map[uint64]uint64, len(x.m)), x.n
	}
	if x.draining != nil {
		x.drain(drainStep)
	}
}

// drain moves up to n keys from draining into m, and lets draining go
// once it is empty.
func (x *keyIndex) drain(n int) {
	for h, v := range x.draining {
		if n == 0 {
			return
		}
		x.m[h] = v
		delete(x.draining, h)
		n--
	}
	x.draining = nil
}

// load migrates a file of format 2 or 3 to the current one and builds the
// index of stored keys (and the empty map of flights) from the index
// bucket, presized: it reads 32 bytes per stored key, not the records.
func (s *BoltStore) load() error {
	var format []byte
	err := s.f.View(func(tx *bolt.Tx) error {
		format = bytes.Clone(tx.Bucket(bucketMeta).Get(metaFormatKey))
		return nil
	})
	if err == nil && bytes.Equal(format, metaFormatV2) {
		err = s.f.Update(migrateV2)
	}
	if err == nil && !bytes.Equal(format, metaFormat) {
		err = s.f.Update(migrateV3)
	}
	if err != nil {
		return err
	}
	defer s.f.Unmap() // the pages read, and their neighbours, leave the process's RSS
	return s.f.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketIndex)
		if b == nil {
			return fmt.Errorf("%w: the index bucket is missing", idemstore.ErrJournalCorrupt)
		}
		x := keyIndex{m: make(map[uint64]uint64, b.Stats().KeyN)}
		c := b.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			n, w := binary.Uvarint(v)
			if len(k) != 16 || w <= 0 || n == 0 {
				return fmt.Errorf("%w: an index entry of %d bytes, count %q", idemstore.ErrJournalCorrupt, len(k), v)
			}
			exp, h := binary.BigEndian.Uint64(k), binary.BigEndian.Uint64(k[8:])
			for range n {
				x.add(h, exp)
			}
		}
		x.peak = x.n
		s.flights.m, s.flights.idx = make(map[string]*flight), x
		return nil
	})
}

// migrateV3 builds the index bucket of a format 3 file from the keys of
// its records, in one transaction: a crash leaves the file in format 3,
// migrated again at the next Open. (This reads every record once.)
func migrateV3(tx *bolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	if !bytes.Equal(meta.Get(metaFormatKey), metaFormatV3) {
		return nil // migrated meanwhile
	}
	if tx.Bucket(bucketIndex) != nil { // made empty by Open, or left by a crash: the transaction rolled back
		if err := tx.DeleteBucket(bucketIndex); err != nil {
			return err
		}
	}
	idx, err := tx.CreateBucket(bucketIndex)
	if err != nil {
		return err
	}
	idx.FillPercent = 1
	c := tx.Bucket(bucketRecords).Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		if len(k) < 8 {
			return fmt.Errorf("%w: a record key of %d bytes", idemstore.ErrJournalCorrupt, len(k))
		}
		if err := indexAdd(idx, binary.BigEndian.Uint64(k), idHash(string(k[8:]))); err != nil {
			return err
		}
	}
	return meta.Put(metaFormatKey, metaFormat)
}

// migrateV2 moves the records of a format 2 file (bucket keys, by id,
// with the bucket expiry as their index by expiry) into the records
// bucket, by expiry, in one transaction, leaving a file of format 3: a
// crash leaves the file in format 2, migrated again at the next Open.
// Records are moved as they are, not decoded: a damaged one stays
// damaged, refused when its key is read, as before. A record without an
// expiry entry (there is none, unless the file was damaged) gets its own
// expiry, or, damaged, never expires.
func migrateV2(tx *bolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	if !bytes.Equal(meta.Get(metaFormatKey), metaFormatV2) {
		return nil // migrated meanwhile
	}
	recs := tx.Bucket(bucketRecords)
	if keys := tx.Bucket(bucketKeys); keys != nil {
		expires := make(map[string]uint64)
		if b := tx.Bucket(bucketExpiry); b != nil {
			c := b.Cursor()
			for k, _ := c.First(); k != nil; k, _ = c.Next() {
				if len(k) >= 8 {
					expires[string(k[8:])] = binary.BigEndian.Uint64(k)
				}
			}
		}
		c := keys.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			exp, ok := expires[string(k)]
			if !ok {
				var r codec.ServerRecord
				exp = math.MaxInt64
				if codec.ServerDecode(v, &r) == nil {
					exp = uint64(max(r.Expires, 0))
				}
			}
			if err := recs.Put(recordKey(exp, string(k)), bytes.Clone(v)); err != nil {
				return err
			}
		}
	}
	for _, name := range [][]byte{bucketKeys, bucketExpiry} {
		if tx.Bucket(name) == nil {
			continue
		}
		if err := tx.DeleteBucket(name); err != nil {
			return err
		}
	}
	return meta.Put(metaFormatKey, metaFormatV3)
}
