package idemstore

import (
	"fmt"
	"time"
)

// RetentionMargin is how much longer than the resend window finished
// records are kept at least: a name must map to its key for as long as
// the operation may be sent again, with time to spare for clocks.
const RetentionMargin = time.Hour

// RetentionFloor returns the shortest retention that keeps what a re-drive
// under p needs: the resend window plus RetentionMargin. Sweeping records
// younger than it may give a named operation a second key.
func (p Policy) RetentionFloor() time.Duration { return p.ResendWindow + RetentionMargin }

// Allows returns nil if an opener with policy next may act on a journal
// whose stored policy is p (the zero Policy allows anything), or an error
// matching ErrPolicyConflict that says why not:
//
//   - next's resend window needs names kept longer than p's retention keeps
//     them (records it would still re-drive may have been swept already);
//   - next's retention is below p's floor (it would sweep names that an
//     opener under p still re-drives).
//
// The key header and the match window may change freely: every operation
// records its own key header.
func (p Policy) Allows(next Policy) error {
	if p == (Policy{}) {
		return nil
	}
	if p.Retention > 0 && next.RetentionFloor() > p.Retention {
		return fmt.Errorf("%w: a resend window of %s needs finished operations kept %s, but the journal keeps them %s: "+
			"open it first with WithRetention(%s) and its current resend window of %s, then lengthen the window once that retention has passed",
			ErrPolicyConflict, next.ResendWindow, next.RetentionFloor(), p.Retention, next.RetentionFloor(), p.ResendWindow)
	}
	if p.ResendWindow > 0 && next.Retention < p.RetentionFloor() {
		return fmt.Errorf("%w: a retention of %s is below the journal's floor of %s (its resend window of %s plus %s): "+
			"open it with WithRetention(%s) while you shorten the resend window, and lower the retention once the old window has passed",
			ErrPolicyConflict, next.Retention, p.RetentionFloor(), p.ResendWindow, RetentionMargin, p.RetentionFloor())
	}
	return nil
}
