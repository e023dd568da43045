// Scrubbing: the free pages that may still hold a finished operation's
// request are overwritten with zeros.

package boltjournal

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem/idemstore"
	"github.com/idemgo/idem/internal/groupcommit"
	bolt "go.etcd.io/bbolt"
)

// noteDrop records that tx drops a request, whose bytes stay in the pages
// tx frees until a scrub overwrites them.
func (f *boltFile) noteDrop(tx *bolt.Tx) {
	raise(&f.dropped, uint64(tx.ID()))
	if f.kick != nil {
		f.kick()
	}
}

// scrubDue reports whether some transaction dropped a request since the
// last scrub.
func (f *boltFile) scrubDue() bool { return f.dropped.Load() > f.scrubbedTo.Load() }

// scrub overwrites with zeros every free page not zeroed since it was
// freed. It runs inside a write transaction, so no page it zeroes is
// allocated meanwhile, and holds off readers, so none of them still reads
// one. The zeros reach the disk with tx's commit. Pages freed by tx itself
// are freed when it commits: the next scrub zeroes them.
func (f *boltFile) scrub(tx *bolt.Tx) error {
	defer f.HoldReaders()()
	ps := tx.DB().Info().PageSize
	hwm := int(tx.Size() / int64(ps)) // pages in use or free; beyond is unused
	if len(f.scrubbed) < hwm {
		f.scrubbed = append(f.scrubbed, make([]bool, hwm-len(f.scrubbed))...)
	}
	zeros := make([]byte, 64*ps)
	run, runLen := 0, 0 // a run of free pages to zero with one write
	flush := func() error {
		for runLen > 0 {
			n := min(runLen, 64)
			if _, err := f.WriteAt(zeros[:n*ps], int64(run)*int64(ps)); err != nil {
				return fmt.Errorf("%w: scrubbing free pages: %w", idemstore.ErrJournalWrite, err)
			}
			run, runLen = run+n, runLen-n
		}
		return nil
	}
	for id := 2; id < hwm; id++ {
		info, err := tx.Page(id)
		if err != nil {
			return err
		}
		free := info != nil && info.Type == "free"
		if !free || f.scrubbed[id] {
			f.scrubbed[id] = free
			if err := flush(); err != nil {
				return err
			}
			continue
		}
		f.scrubbed[id] = true
		if runLen == 0 {
			run = id
		}
		runLen++
	}
	if err := flush(); err != nil {
		return err
	}
	// Pages freed by transactions before tx are free now (no reader holds
	// them: readers are held off), and zeroed.
	raise(&f.scrubbedTo, uint64(tx.ID())-1)
	return nil
}

// raise sets a to v if v is higher.
func raise(a *atomic.Uint64, v uint64) {
	for {
		old := a.Load()
		if old >= v || a.CompareAndSwap(old, v) {
			return
		}
	}
}

// scrubber runs scrubs while the store is open: at most delay after a
// commit that dropped a request, and again while a scrub leaves one due.
func (s *Store) scrubber(delay time.Duration) {
	defer close(s.scrubDone)
	t := time.NewTimer(delay)
	t.Stop()
	armed := false
	for {
		select {
		case <-s.scrubStop:
			t.Stop()
			return
		case <-s.scrubKick:
			if !armed {
				t.Reset(delay)
				armed = true
			}
		case <-t.C:
			armed = false
			s.scrubAsked.Store(false) // kicks from now on wake the scrubber
			if !s.f.scrubDue() {
				continue
			}
			err := s.w.Do(context.Background(), s.f.scrub)
			if err != nil && !errors.Is(err, groupcommit.ErrClosed) {
				s.log.Warn("idem: scrubbing free journal pages", "err", err)
			}
			if s.f.scrubDue() {
				t.Reset(delay)
				armed = true
			}
		}
	}
}

// kickScrub asks the scrubber for a scrub after its delay. It never
// blocks, and wakes the scrubber only when no scrub is asked for yet:
// one that is carries every drop before it runs (scrubDue).
func (s *Store) kickScrub() {
	if s.scrubAsked.Load() || !s.scrubAsked.CompareAndSwap(false, true) {
		return
	}
	select {
	case s.scrubKick <- struct{}{}:
	default:
	}
}
