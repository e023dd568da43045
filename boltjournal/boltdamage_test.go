package boltjournal_test

// Tests of a damaged, foreign or newer journal: what Open and every
// method say of it.

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	mathrand "math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/boltjournal"
	"github.com/idemgo/idem/idemstore"
	"github.com/idemgo/idem/internal/logtest"
	bolt "go.etcd.io/bbolt"
)

// journalWith writes a closed journal at path holding a pending operation
// under each of keys.
func journalWith(t *testing.T, path string, keys ...string) {
	t.Helper()
	s, err := boltjournal.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		mustReserve(t, s, newOp(k))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestBoltStoreCorrupt(t *testing.T) {
	// A journal with a few records, to damage.
	valid := func(t *testing.T) []byte {
		path := filepath.Join(t.TempDir(), "valid.db")
		s, err := boltjournal.Open(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 50 {
			op := newOp(fmt.Sprint("key-", i))
			op.Body = bytes.Repeat([]byte("x"), 2000)
			mustReserve(t, s, op)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	foreign := func(t *testing.T) []byte {
		path := filepath.Join(t.TempDir(), "foreign.db")
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("users")); return err }); err != nil {
			t.Fatal(err)
		}
		db.Close()
		b, _ := os.ReadFile(path)
		return b
	}
	garbage := make([]byte, 64*1024)
	rand.Read(garbage)

	tests := []struct {
		name string
		file func(t *testing.T) []byte
	}{
		{"garbage", func(*testing.T) []byte { return garbage }},
		{"text", func(*testing.T) []byte { return []byte(strings.Repeat("not a journal\n", 1000)) }},
		{"truncated to 100 bytes", func(t *testing.T) []byte { return valid(t)[:100] }},
		{"truncated to one page", func(t *testing.T) []byte { return valid(t)[:4096] }},
		{"truncated to half", func(t *testing.T) []byte { b := valid(t); return b[:len(b)/2] }},
		{"meta pages zeroed", func(t *testing.T) []byte { b := valid(t); clear(b[:8192]); return b }},
		{"foreign bbolt file", foreign},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "journal.db")
			if err := os.WriteFile(path, tc.file(t), 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := boltjournal.Open(path, nil)
			if err == nil {
				s.Close()
				t.Fatal("opened a damaged journal without error")
			}
			if !errors.Is(err, idemstore.ErrJournalCorrupt) {
				t.Fatalf("got %v, want ErrJournalCorrupt", err)
			}
		})
	}
}

func TestBoltStoreDamagedPages(t *testing.T) {
	// Pages damaged after the meta pages: opening may succeed, but reading
	// them must give ErrJournalCorrupt (or succeed), never panic or hang.
	for seed := range uint64(8) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "journal.db")
			s, err := boltjournal.Open(path, nil)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 40 {
				op := newOp(fmt.Sprint("key-", i))
				op.Name = fmt.Sprint("name-", i)
				op.Body = bytes.Repeat([]byte("y"), 1500)
				mustReserve(t, s, op)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			r := mathrand.New(mathrand.NewPCG(seed, 1))
			for range 4 {
				page := 2 + r.IntN(len(b)/4096-2)
				for j := range 4096 {
					b[page*4096+j] = byte(r.Uint32())
				}
			}
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			s, err = boltjournal.Open(path, nil)
			if err != nil {
				if !errors.Is(err, idemstore.ErrJournalCorrupt) {
					t.Fatalf("open: got %v, want ErrJournalCorrupt", err)
				}
				return
			}
			defer s.Close()
			ctx := t.Context()
			okErr := func(what string, err error) {
				if err != nil && !errors.Is(err, idemstore.ErrJournalCorrupt) && !errors.Is(err, idemstore.ErrNotFound) {
					t.Errorf("%s: got %v, want nil, ErrJournalCorrupt or ErrNotFound", what, err)
				}
			}
			for i := range 40 {
				_, err := s.Get(ctx, fmt.Sprint("key-", i))
				okErr("Get", err)
				_, err = s.Named(ctx, fmt.Sprint("name-", i))
				okErr("Named", err)
			}
			_, err = s.Pending(ctx, "", 0)
			okErr("Pending", err)
			_, _, err = s.Reserve(ctx, newOp("new"))
			okErr("Reserve", err)
		})
	}
}

func TestBoltStoreNewerRecordVersion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	journalWith(t, path, "a", "future", "c")
	// A newer idem rewrote one record in a format this one cannot read.
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		// Its version byte is unknown; it ends in the checksum every
		// version ends in.
		rec := []byte{0xfe, 1, 2, 3}
		rec = binary.LittleEndian.AppendUint32(rec, crc32.Checksum(rec, crc32.MakeTable(crc32.Castagnoli)))
		return tx.Bucket(boltjournal.BucketOps).Put([]byte("future"), rec)
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	s := openBolt(t, path)
	ctx := t.Context()
	if _, err := s.Get(ctx, "future"); !errors.Is(err, idemstore.ErrRecordVersion) {
		t.Errorf("Get: got %v, want ErrRecordVersion", err)
	}
	if _, _, err := s.Reserve(ctx, newOp("future")); !errors.Is(err, idemstore.ErrRecordVersion) {
		t.Errorf("Reserve: got %v, want ErrRecordVersion", err)
	}
	if err := s.Finish(ctx, "future", idemstore.Outcome{State: idemstore.StateSucceeded}); !errors.Is(err, idemstore.ErrRecordVersion) {
		t.Errorf("Finish: got %v, want ErrRecordVersion", err)
	}
	if _, err := s.Acquire(ctx, "future", idemstore.Lease{Owner: "me"}, idemstore.Request{}); !errors.Is(err, idemstore.ErrRecordVersion) {
		t.Errorf("Acquire: got %v, want ErrRecordVersion", err)
	}
	pend, err := s.Pending(ctx, "", 0)
	if !errors.Is(err, idemstore.ErrRecordVersion) || fmt.Sprint(keys(pend)) != "[a c future]" || pend[2].State != 0 {
		t.Errorf("Pending = %v, %v; want [a c future], the unreadable one reported with ErrRecordVersion", keys(pend), err)
	}
	for _, k := range []string{"a", "c"} {
		if _, err := s.Get(ctx, k); err != nil {
			t.Errorf("Get(%s): %v", k, err)
		}
	}
}

func TestBoltStoreOpenErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.db")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	notDir := filepath.Join(dir, "file")
	if err := os.WriteFile(notDir, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, path string
		want       error
	}{
		// Only a missing file creates a journal: an existing empty one
		// lost its contents, and its pending operations with them.
		{"empty file", empty, idemstore.ErrJournalCorrupt},
		// These say nothing about a journal's contents: it cannot be
		// created or opened.
		{"empty path", "", idemstore.ErrJournalWrite},
		{"missing parent directory", filepath.Join(dir, "nope", "journal.db"), idemstore.ErrJournalWrite},
		{"path is a directory", dir, idemstore.ErrJournalWrite},
		{"parent is a file", filepath.Join(notDir, "journal.db"), idemstore.ErrJournalWrite},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := boltjournal.Open(tc.path, nil)
			if err == nil {
				s.Close()
				t.Fatal("opened without error")
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			for _, other := range []error{idemstore.ErrJournalCorrupt, idemstore.ErrJournalWrite} {
				if other != tc.want && errors.Is(err, other) {
					t.Fatalf("got %v, which also matches %v", err, other)
				}
			}
		})
	}
	if fi, err := os.Stat(empty); err != nil || fi.Size() != 0 {
		t.Fatalf("the empty journal was changed: %v, %v", fi, err)
	}
}

// forgeFormat rewrites the format marker of the closed journal at path.
func forgeFormat(t *testing.T, path, format string) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(boltjournal.BucketMeta).Put(boltjournal.MetaFormatKey, []byte(format))
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestBoltStoreFormatVersions(t *testing.T) {
	for _, tc := range []struct {
		format  string
		want    error
		message string
	}{
		{"idem-journal/1", idemstore.ErrRecordVersion, "earlier"},
		{"idem-journal/3", idemstore.ErrRecordVersion, "newer"},
		{"idem-journal/10", idemstore.ErrRecordVersion, "newer"},
		{"something else", idemstore.ErrJournalCorrupt, "marker"},
	} {
		t.Run(tc.format, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "journal.db")
			journalWith(t, path, "k1")
			forgeFormat(t, path, tc.format)
			s, err := boltjournal.Open(path, nil)
			if err == nil {
				s.Close()
				t.Fatal("opened without error")
			}
			if !errors.Is(err, tc.want) || (tc.want == idemstore.ErrRecordVersion && errors.Is(err, idemstore.ErrJournalCorrupt)) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.message) {
				t.Fatalf("message %q does not say %q", err, tc.message)
			}
		})
	}
}

func TestBoltStoreDamagedPageDuringWrite(t *testing.T) {
	// A page damaged under a running store: the write that reads it fails
	// with ErrJournalCorrupt, not an untyped panic message.
	path := filepath.Join(t.TempDir(), "journal.db")
	s, err := boltjournal.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range 200 {
		op := newOp(fmt.Sprintf("key-%03d", i))
		op.Body = bytes.Repeat([]byte("z"), 300)
		mustReserve(t, s, op)
	}
	// Overwrite every page but the meta pages in place, behind bbolt's
	// back, with bytes that are no page type bbolt knows.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := f.Stat()
	junk := bytes.Repeat([]byte{0xA5}, int(fi.Size())-8192)
	if _, err := f.WriteAt(junk, 8192); err != nil {
		t.Fatal(err)
	}
	f.Close()
	_, _, err = s.Reserve(t.Context(), newOp("key-100x"))
	if !errors.Is(err, idemstore.ErrJournalCorrupt) {
		t.Fatalf("Reserve over damaged pages = %v, want ErrJournalCorrupt", err)
	}
	if err := s.Attempt(t.Context(), "key-050", idemstore.Attempt{Sent: 1}); err != nil && !errors.Is(err, idemstore.ErrJournalCorrupt) {
		t.Fatalf("Attempt = %v, want nil (queued) or ErrJournalCorrupt", err)
	}
	if _, err := s.Get(t.Context(), "key-050"); !errors.Is(err, idemstore.ErrJournalCorrupt) {
		t.Fatalf("Get = %v, want ErrJournalCorrupt", err)
	}
}

func TestBoltStorePendingNeverSkipsInSilence(t *testing.T) {
	// One page at a time damaged: every pending operation is returned
	// intact, or reported (its key with an error), or the journal as a
	// whole is reported corrupt. None goes missing without an error, and
	// none comes back with a damaged request.
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "journal.db")
	s, err := boltjournal.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{}
	for i := range 120 {
		op := newOp(fmt.Sprintf("key-%03d", i))
		op.Body = bytes.Repeat([]byte{byte('a' + i%26)}, 100+37*i)
		mustReserve(t, s, op)
		if i%3 == 0 {
			if err := s.Finish(ctx, op.Key, idemstore.Outcome{State: idemstore.StateSucceeded, Status: 200}); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want[op.Key] = op.Body
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pages := len(orig) / 4096
	r := mathrand.New(mathrand.NewPCG(7, 7))
	for page := 2; page < pages; page++ {
		for _, kind := range []string{"random", "one byte"} {
			b := bytes.Clone(orig)
			if kind == "random" {
				for j := range 4096 {
					b[page*4096+j] = byte(r.Uint32())
				}
			} else {
				b[page*4096+16+r.IntN(4096-16)] ^= byte(1 + r.IntN(255))
			}
			p := filepath.Join(t.TempDir(), "journal.db")
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
			func() {
				s, err := boltjournal.Open(p, nil)
				if err != nil {
					if !errors.Is(err, idemstore.ErrJournalCorrupt) {
						t.Fatalf("page %d (%s): open = %v, want ErrJournalCorrupt", page, kind, err)
					}
					return
				}
				defer s.Close()
				ops, err := s.Pending(ctx, "", 0)
				if err != nil && !errors.Is(err, idemstore.ErrJournalCorrupt) && !errors.Is(err, idemstore.ErrRecordVersion) {
					t.Fatalf("page %d (%s): Pending error %v is not typed", page, kind, err)
				}
				got := map[string]bool{}
				for _, op := range ops {
					got[op.Key] = true
					if op.State == 0 {
						if err == nil {
							t.Fatalf("page %d (%s): %s reported unreadable without an error", page, kind, op.Key)
						}
						continue
					}
					if body, ok := want[op.Key]; ok && !bytes.Equal(op.Body, body) {
						t.Fatalf("page %d (%s): %s returned with a damaged body", page, kind, op.Key)
					}
				}
				for k := range want {
					if !got[k] && err == nil {
						t.Fatalf("page %d (%s): pending %s is missing and Pending reported no error", page, kind, k)
					}
				}
			}()
		}
	}
}

// TestBoltStoreSweepLogsRecordItCannotDecode checks BoltOptions.Logger's
// promise for Sweep: a finished record whose checksum holds but whose
// fields do not decode is kept, and the warning names it.
func TestBoltStoreSweepLogsRecordItCannotDecode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	journalWith(t, path, "a")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		// Version 2, finished, then a varint that never ends.
		rec := append([]byte{2, byte(idemstore.StateSucceeded), 0}, bytes.Repeat([]byte{0x80}, 60)...)
		rec = binary.LittleEndian.AppendUint32(rec, crc32.Checksum(rec, crc32.MakeTable(crc32.Castagnoli)))
		return tx.Bucket(boltjournal.BucketOps).Put([]byte("undecodable"), rec)
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	logged := &logtest.Records{}
	s, err := boltjournal.Open(path, &boltjournal.Options{Logger: slog.New(logged)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if n, err := s.Sweep(t.Context(), time.Now().Add(time.Hour)); err != nil || n != 0 {
		t.Fatalf("Sweep = %d, %v; want 0 swept", n, err)
	}
	warned := logged.Find("idem: sweep kept unreadable record")
	if len(warned) != 1 || warned[0].Attrs["key"].String() != "undecodable" {
		t.Fatalf("Sweep warned %v; want one warning naming the record it kept", warned)
	}
}
