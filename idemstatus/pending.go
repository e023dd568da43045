package idemstatus

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemgo/idem"
)

// readPending walks up to MaxWalk pending operations of j, counting them
// all and keeping the limit first ones after the key after (the page).
func readPending(ctx context.Context, j Journal, now time.Time, after string, limit int) (*Pending, error) {
	p := &Pending{Operations: []Op{}, After: after}
	var (
		errs   []error
		oldest time.Time
	)
	for cursor, seen := "", 0; ; {
		page, err := j.Pending(ctx, cursor, walkPage)
		if err != nil {
			errs = append(errs, err)
		}
		if len(page) == 0 {
			break
		}
		for _, rec := range page {
			if seen == MaxWalk {
				p.Truncated = true
				break
			}
			seen++
			op := view(rec, now)
			p.Count++
			switch {
			case op.Unreadable:
				p.Unreadable++
			case op.InFlight:
				p.InFlight++
			default:
				p.InDoubt++
				if oldest.IsZero() || rec.Created.Before(oldest) {
					oldest = rec.Created
				}
			}
			switch {
			case after != "" && rec.Key <= after:
				p.Before++
			case len(p.Operations) < limit:
				p.Operations = append(p.Operations, op)
			default:
				p.More = true
			}
		}
		if p.Truncated || len(page) < walkPage {
			break
		}
		cursor = page[len(page)-1].Key
	}
	if p.More && len(p.Operations) > 0 {
		p.Next = p.Operations[len(p.Operations)-1].Key
	}
	if !oldest.IsZero() {
		p.OldestInDoubt = &oldest
		p.OldestInDoubtAge = max(now.Sub(oldest), 0).Seconds()
	}
	return p, errors.Join(errs...)
}

// view is how the page shows rec.
func view(rec idem.Operation, now time.Time) Op {
	return Op{
		Key: rec.Key, Name: rec.Name, Method: rec.Method, URL: idem.TrimQuery(rec.URL),
		Created: rec.Created, AgeSeconds: max(now.Sub(rec.Created), 0).Seconds(),
		Attempts: rec.Attempts, LastStatus: rec.LastStatus, LastError: rec.LastError,
		InFlight: rec.State == idem.StatePending && rec.Owner != "" && rec.LeaseUntil.After(now),
		Owner:    rec.Owner, LeaseUntil: rec.LeaseUntil,
		Redacted: rec.Redacted, Unreplayable: rec.Unreplayable,
		Unreadable: rec.State == 0,
	}
}

// advise fills op's Why and Do: why it is pending, in words, and what the
// operator can do about it. credentials says that the application resends
// credentials itself (WithResumePrepare).
func advise(op *Op, credentials bool) {
	op.NeedsCredentials = op.Redacted && !credentials
	switch {
	case op.Unreadable:
		op.Why = "the journal cannot read this record: " + op.LastError
		op.Do = "run `idem verify`; reconcile it by key with the provider, then `idem expire` it"
	case op.InFlight:
		// The journal counts an attempt when it starts: the last one
		// counted is the one under way.
		op.Why = "being sent now by " + ownerOf(op.Owner)
		if op.Attempts > 0 {
			op.Why += ", attempt " + thousands(op.Attempts) + " under way"
		}
		if op.LastStatus != 0 || op.LastError != "" {
			op.Why += " (last: " + outcome(op.LastStatus, op.LastError) + ")"
		}
		op.Do = "nothing yet: its call or Resume owns it until " + op.LeaseUntil.UTC().Format(time.RFC3339)
	case op.Unreplayable:
		op.Why = "in doubt after " + outcome(op.LastStatus, op.LastError) + "; its body was over the journal's limit and was not journaled"
		op.Do = "re-drive it from the application with its name or key (idem.WithOperation / idem.WithKey); Resume cannot send it"
	case op.NeedsCredentials:
		op.Why = "in doubt after " + outcome(op.LastStatus, op.LastError) + "; it was journaled without its credentials"
		op.Do = "resend it with its credentials: give the application a WithResumePrepare hook that adds them, or run `idem resume --header-file FILE` " + whileStopped + "; or re-drive it by name"
	case op.LastStatus == 0 && op.LastError == "": // its first attempt, counted when it started, never ended
		op.Why = "in doubt: the process ended before the outcome of its request was known"
		op.Do = "Resume sends it again with its key: the application's, or `idem resume` " + whileStopped + "; or re-drive it by name"
	default:
		op.Why = "in doubt after " + outcome(op.LastStatus, op.LastError)
		op.Do = "Resume sends it again with its key: the application's, or `idem resume` " + whileStopped + "; or re-drive it by name"
		if op.Redacted {
			op.Do = "Resume in the application sends it again with its key and credentials, and so does `idem resume --header-file FILE` given them " + whileStopped + "; or re-drive it by name"
		}
	}
}

// whileStopped says when the idem command may resume a journal: it
// cannot open a bbolt file an application holds, and on PostgreSQL it
// takes only operations no running replica holds.
const whileStopped = "(a bbolt journal once the application is stopped; a PostgreSQL one beside it)"

// outcome says in words what an operation's last attempt got.
func outcome(status int, errText string) string {
	switch {
	case status == http.StatusConflict:
		return "409: the server was still working on it"
	case status == http.StatusTooManyRequests:
		return "429: the server asked to slow down"
	case status >= 500:
		return fmt.Sprintf("%d %s: the server failed or was unavailable", status, http.StatusText(status))
	case status == http.StatusUnauthorized || status == http.StatusForbidden || status == http.StatusProxyAuthRequired:
		return fmt.Sprintf("%d to a resend: says nothing about the first request", status)
	case status != 0:
		return fmt.Sprintf("%d %s", status, http.StatusText(status))
	case errText == "":
		return "no answer"
	}
	low := strings.ToLower(errText)
	switch {
	case strings.Contains(low, "eof") || strings.Contains(low, "connection reset") || strings.Contains(low, "broken pipe"):
		return "the connection closed before an answer (" + errText + ")"
	case strings.Contains(low, "timeout") || strings.Contains(low, "deadline"):
		return "no answer in time (" + errText + ")"
	case strings.Contains(low, "refused"):
		return "the connection was refused (" + errText + ")"
	case strings.Contains(low, "canceled"):
		return "the caller gave up after sending (" + errText + ")"
	}
	return "an error (" + errText + ")"
}

func ownerOf(owner string) string {
	if owner == "" {
		return "this process"
	}
	return owner
}

// thousands formats n with a comma every three digits: 10,000.
func thousands(n int) string {
	if n < 0 {
		return "-" + thousands(-n)
	}
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
