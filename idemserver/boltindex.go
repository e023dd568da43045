package idemserver

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"

	bolt "go.etcd.io/bbolt"

	"github.com/idemgo/idem/idemstore"
	"github.com/idemgo/idem/internal/codec"
)

// load migrates a file of format 2 to the current one and builds the
// index of stored keys (and the empty map of flights).
func (s *BoltStore) load() error {
	v2 := false
	err := s.f.View(func(tx *bolt.Tx) error {
		v2 = bytes.Equal(tx.Bucket(bucketMeta).Get(metaFormatKey), metaFormatV2)
		return nil
	})
	if err == nil && v2 {
		err = s.f.Update(migrateV2)
	}
	if err != nil {
		return err
	}
	return s.f.View(func(tx *bolt.Tx) error {
		stored := make(map[string]uint64)
		c := tx.Bucket(bucketRecords).Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			if len(k) < 8 {
				return fmt.Errorf("%w: a record key of %d bytes", idemstore.ErrJournalCorrupt, len(k))
			}
			// Keys are in expiry order: a later record of the same id
			// (there is none, unless the file was damaged) wins.
			stored[string(k[8:])] = binary.BigEndian.Uint64(k)
		}
		s.flights.m, s.flights.stored, s.flights.peak = make(map[string]*flight), stored, len(stored)
		return nil
	})
}

// migrateV2 moves the records of a format 2 file (bucket keys, by id,
// with the bucket expiry as their index by expiry) into the records
// bucket, by expiry, in one transaction: a crash leaves the file in
// format 2, migrated again at the next Open. Records are moved as they
// are, not decoded: a damaged one stays damaged, refused when its key is
// read, as before. A record without an expiry entry (there is none,
// unless the file was damaged) gets its own expiry, or, damaged, never
// expires.
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
	return meta.Put(metaFormatKey, metaFormat)
}
