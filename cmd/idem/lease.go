package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/idemgo/idem"
)

// commandLease is how long the command holds an operation it takes on a
// shared journal: its resends renew it while they run.
const commandLease = time.Minute

// owner is the name the command's leases carry on a shared journal, so
// that an operator reading `idem pending` on another terminal, or a
// replica's logs, sees who holds an operation.
func owner() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("idem-command@%s/%d", host, os.Getpid())
}

// storeNow returns the store's clock (idem.Clock) if it has one, else the
// local clock.
func (c *cli) storeNow(s idem.KeyStore) time.Time {
	if clock, ok := s.(idem.Clock); ok {
		if now, err := clock.Now(c.ctx); err == nil {
			return now
		}
	}
	return time.Now()
}

// errLeased is returned for an operation a running replica holds.
var errLeased = errors.New("under a live lease")

// take leases the pending operation op to the command, as a replica's
// Resume would take it: only if no one else holds a live lease on it
// (KeyStore.Claim, which never takes an operation under another owner's
// live lease). Claim takes the first pending operation after a key, so
// take asks from the key just before op's: keys are 1 to 255 bytes of
// visible ASCII (idem.CheckKey), between which and op.Key there is none.
func (c *cli) take(s idem.KeyStore, op idem.Operation) error {
	now := c.storeNow(s)
	l := idem.Lease{Owner: owner(), At: now, Until: now.Add(commandLease)}
	got, err := s.Claim(c.ctx, l, keyBefore(op.Key), 1)
	if err != nil && (len(got) == 0 || got[0].Key != op.Key) {
		return fmt.Errorf("taking operation %s: %w", cell(op.Key), err)
	}
	for _, g := range got {
		if g.Key == op.Key {
			return nil
		}
		// Another operation came first: give it back at once.
		_ = c.giveBack(s, g.Key, now)
	}
	holder := "another owner"
	if cur, err := s.Get(c.ctx, op.Key); err == nil {
		if cur.State != idem.StatePending {
			return fmt.Errorf("operation %s is %s now, not pending: nothing to expire", cell(op.Key), cur.State)
		}
		holder = cell(cur.Owner)
		if !cur.LeaseUntil.IsZero() {
			holder += " until " + cur.LeaseUntil.UTC().Format(time.RFC3339)
		}
	}
	return fmt.Errorf("operation %s is %w of %s: a running replica may be sending it; try again once its lease lapsed", cell(op.Key), errLeased, holder)
}

// giveBack ends the command's lease on the operation key at now, so that
// the replicas' Resume may take it at once rather than when the lease
// lapses.
func (c *cli) giveBack(s idem.KeyStore, key string, now time.Time) error {
	return s.Renew(c.ctx, key, idem.Lease{Owner: owner(), At: now, Until: now})
}

// keyBefore returns the greatest string that sorts before key among
// strings of visible ASCII no longer than 255 bytes, or one with no such
// string between it and key.
func keyBefore(key string) string {
	if key == "" {
		return ""
	}
	last := key[len(key)-1]
	if last <= '!' {
		return key[:len(key)-1]
	}
	return key[:len(key)-1] + string(last-1) + strings.Repeat("~", 256)
}
