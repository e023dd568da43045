// The bbolt journal's checks of its records: Open's check, and Salvage
// for tools that read a damaged journal.

package boltjournal

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/idemgo/idem/idemstore"
	"github.com/idemgo/idem/internal/codec"
	bolt "go.etcd.io/bbolt"
)

// maxReported bounds how many damaged records an error names.
const maxReported = 5

// check is Open's check of the records (see Store): every pending
// record decodes with its body, every name maps to a well-formed key that
// has a record, and every named pending record is found by its name. A record of a newer
// version is not damage.
func (f *boltFile) check() error {
	var bad []error
	n := 0
	note := func(err error) {
		if errors.Is(err, idemstore.ErrRecordVersion) && !errors.Is(err, idemstore.ErrJournalCorrupt) {
			return
		}
		n++
		if len(bad) < maxReported {
			bad = append(bad, err)
		}
	}
	err := f.View(func(tx *bolt.Tx) error {
		ops, err := opsOf(tx)
		if err != nil {
			return err
		}
		names, err := namesOf(tx)
		if err != nil {
			return err
		}
		pending := map[string]string{} // key -> name, of the pending records
		c := ops.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if isBodyKey(k) {
				continue
			}
			if len(v) >= 2 && (v[0] == codec.Version || v[0] == codec.VersionExt) && idemstore.State(v[1]).Finished() {
				continue
			}
			op, err := loadOp(ops, string(k))
			if err != nil {
				note(err)
				continue
			}
			pending[op.Key] = op.Name
		}
		err = names.ForEach(func(name, key []byte) error {
			if err := idemstore.CheckKey(string(key)); err != nil {
				note(fmt.Errorf("%w: name %q maps to %q, which is no key", idemstore.ErrJournalCorrupt, name, key))
			} else if n, ok := pending[string(key)]; ok {
				if n != string(name) {
					note(fmt.Errorf("%w: name %q maps to pending record %q, which is named %q", idemstore.ErrJournalCorrupt, name, key, n))
				}
			} else if ops.Get(key) == nil {
				// Reserve writes a name with its record and Sweep deletes
				// them together: a name without one is damage.
				note(fmt.Errorf("%w: name %q maps to %q, which has no record", idemstore.ErrJournalCorrupt, name, key))
			}
			return nil
		})
		if err != nil {
			return err
		}
		// Every pending record with a name must be found by it.
		for key, name := range pending {
			if name == "" {
				continue
			}
			if got := names.Get([]byte(name)); string(got) != key {
				note(fmt.Errorf("%w: pending record %q is named %q, but the name maps to %q", idemstore.ErrJournalCorrupt, key, name, got))
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	more := ""
	if n > len(bad) {
		more = fmt.Sprintf(" (the first %d shown)", len(bad))
	}
	return fmt.Errorf("%w: %d pending records or name mappings are damaged%s: %w; "+
		"run \"idem ls\" or \"idem pending\" on the journal to list what is readable", idemstore.ErrJournalCorrupt, n, more, errors.Join(bad...))
}

// Salvage returns every record of a journal, damaged or not, that can
// still be read, in key order and without bodies, for tools that help an
// operator reconcile a damaged journal. A record that does not decode is
// returned with only its Key, State 0 and LastError saying why ("damaged"
// or "written by a newer idem"). Where a damaged page hides records, it
// reads the records after it by walking back from the end. The error
// names what could not be read; it is nil when everything was.
//
// Salvage changes nothing and never panics. Open the journal with
// Options.SkipCheck to salvage one that Open refuses.
func (s *Store) Salvage(ctx context.Context) ([]idemstore.Operation, error) {
	if err := s.settle(ctx); err != nil && !errors.Is(err, idemstore.ErrJournalCorrupt) {
		return nil, err
	}
	var (
		fwd, back []idemstore.Operation
		errs      []error
	)
	fwdErr := s.f.salvageWalk(false, "", func(op idemstore.Operation) { fwd = append(fwd, op) })
	if fwdErr == nil {
		return fwd, joinUnreadable(fwd)
	}
	last := ""
	if len(fwd) > 0 {
		last = fwd[len(fwd)-1].Key
	}
	backErr := s.f.salvageWalk(true, last, func(op idemstore.Operation) { back = append(back, op) })
	first := "the end"
	if len(back) > 0 {
		first = fmt.Sprintf("%q", back[len(back)-1].Key)
	}
	from := "the start"
	if last != "" {
		from = fmt.Sprintf("%q", last)
	}
	errs = append(errs, fmt.Errorf("records between %s and %s could not be read: %w", from, first, fwdErr))
	if backErr != nil && len(back) == 0 {
		errs = append(errs, backErr)
	}
	for i := len(back) - 1; i >= 0; i-- {
		fwd = append(fwd, back[i])
	}
	return fwd, errors.Join(append(errs, joinUnreadable(fwd))...)
}

// joinUnreadable returns an error naming the records ops holds that could
// not be decoded, or nil.
func joinUnreadable(ops []idemstore.Operation) error {
	var bad []string
	for _, op := range ops {
		if op.State == 0 {
			bad = append(bad, fmt.Sprintf("%q: %s", op.Key, op.LastError))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %d records could not be read: %s", idemstore.ErrJournalCorrupt, len(bad), strings.Join(bad, "; "))
}

// salvageWalk walks the records in key order (backward: from the last,
// down to the one after stop) in one read transaction, calling fn for
// each, until the end or a damaged page. It recovers from bbolt's panics
// and faults without marking the store broken: a read transaction holds
// no lock bbolt would leave behind.
func (f *boltFile) salvageWalk(backward bool, stop string, fn func(idemstore.Operation)) error {
	return f.Salvage(func(tx *bolt.Tx) error {
		ops, err := opsOf(tx)
		if err != nil {
			return err
		}
		c := ops.Cursor()
		k, v := c.First()
		if backward {
			k, v = c.Last()
		}
		for ; k != nil; k, v = step(c, backward) {
			if backward && string(k) <= stop {
				return nil
			}
			if isBodyKey(k) {
				continue
			}
			var r codec.Record
			key := string(k)
			if derr := codec.Decode(v, &r); derr != nil {
				fn(idemstore.Operation{Key: key, LastError: codecErr(key, derr).Error()})
				continue
			}
			op := fromRecord(key, &r)
			op.Body = nil
			fn(op)
		}
		return nil
	})
}

func step(c *bolt.Cursor, backward bool) ([]byte, []byte) {
	if backward {
		return c.Prev()
	}
	return c.Next()
}
