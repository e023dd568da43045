// The bbolt journal's records: buckets, the mapping between an Operation
// and its codec record, and bodies stored apart.

package boltjournal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemgo/idem/idemstore"
	"github.com/idemgo/idem/internal/codec"
	bolt "go.etcd.io/bbolt"
)

// opsOf returns the ops bucket of tx.
func opsOf(tx *bolt.Tx) (*bolt.Bucket, error) {
	b := tx.Bucket(bucketOps)
	if b == nil {
		return nil, fmt.Errorf("%w: the ops bucket is missing", idemstore.ErrJournalCorrupt)
	}
	b.FillPercent = opsFill
	return b, nil
}

func namesOf(tx *bolt.Tx) (*bolt.Bucket, error) {
	b := tx.Bucket(bucketNames)
	if b == nil {
		return nil, fmt.Errorf("%w: the names bucket is missing", idemstore.ErrJournalCorrupt)
	}
	return b, nil
}

func metaOf(tx *bolt.Tx) (*bolt.Bucket, error) {
	b := tx.Bucket(bucketMeta)
	if b == nil {
		return nil, fmt.Errorf("%w: the meta bucket is missing", idemstore.ErrJournalCorrupt)
	}
	return b, nil
}

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
	// flagBodyApart: the body is not in the record but under the
	// record's key followed by a NUL byte (bodyKey), right after it in
	// the same B+tree. Keys are visible ASCII, so no key ends in NUL.
	flagBodyApart = 1 << 2
)

// bodyApart is the body size from which a body is stored apart from its
// record: a large body is then put as it is, where inline it would be
// copied into the record first.
const bodyApart = 32 << 10

// bodyKey returns the key under which the body of the record under key is
// stored apart.
func bodyKey(key string) []byte {
	k := make([]byte, len(key)+1)
	copy(k, key)
	return k
}

// isBodyKey reports whether k is a body stored apart, not a record.
func isBodyKey(k []byte) bool { return len(k) > 0 && k[len(k)-1] == 0 }

// loadBody sets op.Body from the body stored apart if r says so.
func loadBody(ops *bolt.Bucket, r *codec.Record, op *idemstore.Operation) error {
	if r.Flags&flagBodyApart == 0 {
		return nil
	}
	v := ops.Get(bodyKey(op.Key))
	if v == nil {
		return fmt.Errorf("record %q: %w: its body is missing", op.Key, idemstore.ErrJournalCorrupt)
	}
	op.Body = bytes.Clone(v)
	return nil
}

func toRecord(op *idemstore.Operation) codec.Record {
	var flags uint8
	if op.Redacted {
		flags |= flagRedacted
	}
	if op.Unreplayable {
		flags |= flagUnreplayable
	}
	return codec.Record{
		Name: op.Name, Method: op.Method, URL: op.URL, Host: op.Host,
		Fingerprint: op.Fingerprint, State: uint8(op.State), Flags: flags,
		Attempts: int64(op.Attempts), LastStatus: int64(op.LastStatus), LastError: op.LastError,
		Created: toNanos(op.Created), Updated: toNanos(op.Updated), LeaseUntil: toNanos(op.LeaseUntil),
		Owner: op.Owner, KeyHeader: op.KeyHeader, Header: op.Header, Body: op.Body,
		Trace: op.Trace, History: toHistory(op.History),
	}
}

func fromRecord(key string, r *codec.Record) idemstore.Operation {
	return idemstore.Operation{
		Key: key, Name: r.Name, Method: r.Method, URL: r.URL, Host: r.Host,
		Fingerprint: r.Fingerprint, State: idemstore.State(r.State),
		Redacted: r.Flags&flagRedacted != 0, Unreplayable: r.Flags&flagUnreplayable != 0,
		Attempts: int(r.Attempts), LastStatus: int(r.LastStatus), LastError: r.LastError,
		Created: fromNanos(r.Created), Updated: fromNanos(r.Updated), LeaseUntil: fromNanos(r.LeaseUntil),
		Owner: r.Owner, KeyHeader: r.KeyHeader, Header: http.Header(r.Header), Body: r.Body,
		Trace: r.Trace, History: fromHistory(r.History),
	}
}

// toHistory and fromHistory convert an operation's history to the codec's
// and back; an empty one is nil, which the codec writes as version 2.
func toHistory(h []idemstore.Attempt) []codec.Attempt {
	if len(h) == 0 {
		return nil
	}
	out := make([]codec.Attempt, len(h))
	for i, a := range h {
		out[i] = toAttempt(a)
	}
	return out
}

// toAttempt converts one attempt of an operation's history to the codec's.
func toAttempt(a idemstore.Attempt) codec.Attempt {
	return codec.Attempt{At: toNanos(a.At), Sent: int64(a.Sent), Status: int64(a.Status), Err: a.Err, Reason: a.Reason}
}

func fromHistory(h []codec.Attempt) []idemstore.Attempt {
	if len(h) == 0 {
		return nil
	}
	out := make([]idemstore.Attempt, len(h))
	for i, a := range h {
		out[i] = idemstore.Attempt{At: fromNanos(a.At), Sent: int(a.Sent), Status: int(a.Status), Err: a.Err, Reason: a.Reason}
	}
	return out
}

// appendHistory is AppendHistory for a record being rewritten: r's
// history aliases the transaction's memory, which the rewrite copies.
func appendHistory(r *codec.Record, a idemstore.Attempt) {
	h := r.History
	if drop := len(h) + 1 - idemstore.MaxHistory; drop > 0 {
		h = h[drop:]
	}
	r.History = append(h[:len(h):len(h)], toAttempt(a))
}

// codecErr maps a codec error about the record under key to
// ErrRecordVersion or ErrJournalCorrupt.
func codecErr(key string, err error) error {
	if errors.Is(err, codec.ErrVersion) {
		return fmt.Errorf("record %q was written by a newer idem (%w): %w", key, idemstore.ErrRecordVersion, err)
	}
	return fmt.Errorf("record %q is damaged (%w): %w", key, idemstore.ErrJournalCorrupt, err)
}

// loadOp returns the record for key with its request, or ErrNotFound.
func loadOp(ops *bolt.Bucket, key string) (idemstore.Operation, error) {
	v := ops.Get([]byte(key))
	if v == nil {
		return idemstore.Operation{}, fmt.Errorf("%q: %w", key, idemstore.ErrNotFound)
	}
	var r codec.Record
	if err := codec.Decode(v, &r); err != nil {
		return idemstore.Operation{}, codecErr(key, err)
	}
	op := fromRecord(key, &r)
	return op, loadBody(ops, &r, &op)
}

// change rewrites the record for key in ops with the scratch of ops's
// write transaction, which its changes share: it reads the record's head
// (aliasing the transaction's memory, so r must not outlive the call) and its raw request
// section, lets fn change them, and puts the result. fn returns the
// request section to keep (req, or nil to drop it), errUnchanged to leave
// the record as it is and return nil, or an error that leaves the record
// as it was.
func (s *Store) change(ops *bolt.Bucket, key string, fn func(r *codec.Record, req []byte) ([]byte, error)) error {
	return s.scratch.change(ops, key, fn)
}

// encodeKV encodes r under key into buf if it fits, else into a new
// buffer, and returns key and value.
func encodeKV(buf []byte, key string, r *codec.Record) (k, v []byte) {
	if n := len(key) + codec.Size(r); n > cap(buf) {
		buf = make([]byte, 0, n)
	}
	buf = append(buf[:0], key...)
	buf = codec.Append(buf, r)
	return buf[:len(key)], buf[len(key):]
}

// metaPolicyKey is where the meta bucket keeps the application's policy.
var metaPolicyKey = []byte("policy")

// Policy implements PolicyStore.
func (s *Store) Policy(ctx context.Context) (idemstore.Policy, error) {
	if err := s.settle(ctx); err != nil {
		return idemstore.Policy{}, err
	}
	var p idemstore.Policy
	err := s.f.View(func(tx *bolt.Tx) error {
		m, err := metaOf(tx)
		if err != nil {
			return err
		}
		v := m.Get(metaPolicyKey)
		if v == nil {
			return nil
		}
		var cp codec.Policy
		if err := codec.DecodePolicy(v, &cp); err != nil {
			return codecErr("policy", err)
		}
		p = idemstore.Policy{KeyHeader: cp.KeyHeader, ResendWindow: time.Duration(cp.ResendWindow),
			Retention: time.Duration(cp.Retention), MatchWindow: time.Duration(cp.MatchWindow)}
		return nil
	})
	if err != nil {
		return idemstore.Policy{}, fmt.Errorf("policy: %w", err)
	}
	return p, nil
}

// SetPolicy implements PolicyStore. It returns once the policy is durable.
func (s *Store) SetPolicy(ctx context.Context, p idemstore.Policy) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	v := codec.EncodePolicy(&codec.Policy{KeyHeader: p.KeyHeader, ResendWindow: int64(p.ResendWindow),
		Retention: int64(p.Retention), MatchWindow: int64(p.MatchWindow)})
	err := s.write(ctx, func(tx *bolt.Tx) error {
		m, err := metaOf(tx)
		if err != nil {
			return err
		}
		return m.Put(metaPolicyKey, v)
	})
	if err != nil {
		return fmt.Errorf("set policy: %w", err)
	}
	return nil
}
