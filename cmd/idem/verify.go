package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strings"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/idemgo/idem"
)

// maxProblems caps how many problems verify prints.
const maxProblems = 20

// verifyView is verify's JSON form.
type verifyView struct {
	OK       bool     `json:"ok"`
	FileSize int64    `json:"file_size_bytes"`
	Pending  int      `json:"pending_read"`
	Problems []string `json:"problems"`
}

// verify checks the journal in two passes. First bbolt's own consistency
// check, on a read-only open that writes nothing: every page reachable or
// free, none twice, keys in order. Then idem's: the journal opens (its
// format marker), and every pending operation reads and is found again by
// its name. Finished records are checked by the first pass only: the
// journal's API walks pending records alone.
func (c *cli) verify(_ []string) error {
	if c.shared() {
		return usageError("verify checks a bbolt journal file page by page; a PostgreSQL journal has no file of idem's to check " +
			"(PostgreSQL checks its own pages): ls, pending and stats read every record and name those that cannot be read")
	}
	v := verifyView{Problems: []string{}}
	problem := func(format string, args ...any) {
		if len(v.Problems) < maxProblems {
			v.Problems = append(v.Problems, fmt.Sprintf(format, args...))
		} else if len(v.Problems) == maxProblems {
			v.Problems = append(v.Problems, "... (more problems not shown)")
		}
	}
	if err := c.checkFile(); err != nil {
		if !errors.Is(err, idem.ErrJournalCorrupt) {
			return err
		}
		problem("%v", err)
		return c.verified(v)
	}
	fi, err := os.Stat(c.journal)
	if err != nil {
		return err
	}
	v.FileSize = fi.Size()

	if err := c.checkPages(fi.Size(), problem); err != nil {
		return err
	}
	if len(v.Problems) > 0 {
		return c.verified(v) // idem would read damaged pages
	}

	s, err := c.openRead()
	switch {
	case errors.Is(err, idem.ErrJournalLocked):
		return err
	case err != nil:
		problem("opening the journal: %v", err)
		return c.verified(v)
	}
	ops, perr := allPending(c.ctx, s)
	v.Pending = len(ops)
	if perr != nil {
		problem("reading pending operations: %v", perr)
	}
	for _, op := range ops {
		if op.State == 0 {
			problem("pending record %s cannot be read: %s", op.Key, op.LastError)
			continue
		}
		if op.Name == "" {
			continue
		}
		named, err := s.(*idem.BoltStore).Named(c.ctx, op.Name)
		switch {
		case err != nil:
			problem("pending operation %s: its name %q does not resolve: %v", op.Key, op.Name, err)
		case named.Key != op.Key:
			problem("pending operation %s: its name %q resolves to another key, %s", op.Key, op.Name, named.Key)
		}
	}
	if err := s.Close(); err != nil {
		problem("closing the journal: %v", err)
	}
	return c.verified(v)
}

// checkPages runs bbolt's consistency check on a read-only open of the
// journal and reports what it finds to problem. It returns an error only
// when it could not check (the journal is locked).
func (c *cli) checkPages(size int64, problem func(string, ...any)) (err error) {
	// A damaged file can make bbolt panic or fault on its memory map.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			problem("bbolt stopped reading the file at a damaged page (%v)", p)
		}
	}()
	db, err := bolt.Open(c.journal, 0o600, &bolt.Options{ReadOnly: true, Timeout: c.lockTimeout})
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return fmt.Errorf("%w: %w", idem.ErrJournalLocked, err)
	case err != nil:
		problem("not a readable bbolt file: %v", err)
		return nil
	}
	defer db.Close()
	return db.View(func(tx *bolt.Tx) error {
		// Pages past the end of a truncated file would fault in bbolt's
		// checking goroutine, where nothing can recover: check first.
		if size < tx.Size() {
			problem("file is %d bytes, its pages need %d (truncated)", size, tx.Size())
			return nil
		}
		for err := range tx.Check() {
			// bbolt hands back a panic of its check as an error
			// "panic: ...": say what it means.
			if msg, ok := strings.CutPrefix(err.Error(), "panic: "); ok {
				problem("page check stopped at a damaged page (%s)", msg)
				continue
			}
			problem("page check: %v", err)
		}
		return nil
	})
}

// verified prints verify's result; it returns errDamaged if there were
// problems.
func (c *cli) verified(v verifyView) error {
	v.OK = len(v.Problems) == 0
	if c.json {
		if err := c.writeJSON(v); err != nil {
			return err
		}
	} else if v.OK {
		fmt.Fprintf(c.out, "ok: %s (%d bytes): every page checked, %d pending operations read\n", c.journal, v.FileSize, v.Pending)
	} else {
		for _, p := range v.Problems {
			fmt.Fprintf(c.out, "damage: %s\n", p)
		}
	}
	if !v.OK {
		return errDamaged
	}
	return nil
}
