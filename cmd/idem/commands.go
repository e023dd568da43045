package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/idemgo/idem"
)

// listing is the JSON form of ls and pending.
type listing struct {
	Operations []opView `json:"operations"`
	// Unreadable counts pending records the journal could not read.
	Unreadable int    `json:"unreadable"`
	Error      string `json:"error,omitempty"`
}

// readListing reads the pending operations for pending, or every
// operation for ls (all). A failure to read some records is reported in
// the listing, not as an error.
func (c *cli) readListing(all bool) (l listing, err error) {
	s, err := c.openSalvage()
	if err != nil {
		return l, err
	}
	defer closeStore(s, &err)
	var (
		ops  []idem.Operation
		perr error
	)
	if all {
		ops, perr = allRecords(c.ctx, s)
		for i := range ops {
			ops[i].Header = nil // ls shows no request, as before
		}
	} else {
		ops, perr = salvagePending(c.ctx, s)
	}
	l.Operations = make([]opView, 0, len(ops))
	for _, op := range ops {
		if op.State == 0 {
			l.Unreadable++
		}
		l.Operations = append(l.Operations, c.view(op, false, false))
	}
	if perr != nil {
		if len(ops) == 0 {
			return l, perr
		}
		l.Error = perr.Error()
	}
	return l, nil
}

// ls lists every operation in the journal, pending and finished, one
// line each.
func (c *cli) ls(_ []string) error {
	l, err := c.readListing(true)
	if err != nil {
		return err
	}
	pending := 0
	for _, v := range l.Operations {
		if v.State == idem.StatePending.String() {
			pending++
		}
	}
	return c.printListing(l, "KEY\tNAME\tSTATE\tMETHOD\tURL\tATTEMPTS\tAGE", func(v opView) string {
		return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%d\t%s", cell(v.Key), listCell(dash(v.Name)), v.State, cell(dash(v.Method)), listCell(dash(v.URL)), v.Attempts, age(v.AgeSeconds))
	}, fmt.Sprintf("%d operations, %d pending.", len(l.Operations), pending))
}

// pending lists the pending operations with what Resume can do for them.
func (c *cli) pending(_ []string) error {
	l, err := c.readListing(false)
	if err != nil {
		return err
	}
	summary := fmt.Sprintf("%d pending (in doubt: no process holds the journal, so none is in flight).", len(l.Operations))
	if c.shared() {
		leased := 0
		for _, v := range l.Operations {
			if strings.HasPrefix(v.Resend, "leased") {
				leased++
			}
		}
		summary = fmt.Sprintf("%d pending, %d under a live lease (a running replica may be sending them; the others are in doubt).", len(l.Operations), leased)
	}
	return c.printListing(l, "KEY\tNAME\tMETHOD\tURL\tAGE\tATTEMPTS\tLAST\tRESEND", func(v opView) string {
		return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s", cell(v.Key), listCell(dash(v.Name)), cell(dash(v.Method)), listCell(dash(v.URL)), age(v.AgeSeconds), v.Attempts, cell(last(v)), v.Resend)
	}, summary)
}

// printListing prints l as JSON, or as a table with header, one row a
// line, and summary below; then it reports the records it could not read.
func (c *cli) printListing(l listing, header string, row func(opView) string, summary string) error {
	if c.json {
		return c.writeJSON(l)
	}
	tw := c.table()
	fmt.Fprintln(tw, header)
	for _, v := range l.Operations {
		fmt.Fprintln(tw, row(v))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(c.out, summary)
	if l.Unreadable > 0 || l.Error != "" {
		return fmt.Errorf("%d records could not be read: %s", l.Unreadable, l.Error)
	}
	return nil
}

// show prints one operation.
func (c *cli) show(arg string, body bool) (err error) {
	s, err := c.openSalvage()
	if err != nil {
		return err
	}
	defer closeStore(s, &err)
	op, err := find(c.ctx, s, arg)
	if err != nil {
		return err
	}
	v := c.view(op, true, body)
	v.Trace, v.History = op.Trace, historyView(op.History)
	if c.json {
		return c.writeJSON(v)
	}
	tw := c.table()
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s\t%s\n", k, v)
		}
	}
	row("key", cellIf(v.Key))
	row("name", cellIf(v.Name))
	row("state", v.State)
	row("request", strings.TrimSpace(cellIf(v.Method)+" "+cellIf(v.URL)))
	row("host", cellIf(v.Host))
	row("attempts", fmt.Sprint(v.Attempts))
	if v.LastStatus != 0 {
		row("last status", fmt.Sprint(v.LastStatus))
	}
	if op.State == idem.StateSucceeded {
		row("note", cellIf(v.LastError)) // a request performed without its answer kept
	} else {
		row("last error", cellIf(v.LastError))
	}
	if !op.Created.IsZero() {
		row("created", fmt.Sprintf("%s (%s ago)", op.Created.Format(time.RFC3339), age(v.AgeSeconds)))
	}
	if !op.Updated.IsZero() {
		row("updated", op.Updated.Format(time.RFC3339))
	}
	switch {
	case v.Owner == "" || op.State != idem.StatePending:
	case v.LeaseUntil.After(c.now):
		row("lease", fmt.Sprintf("held by %s until %s", cell(v.Owner), v.LeaseUntil.Format(time.RFC3339)))
	default:
		row("lease", fmt.Sprintf("lapsed (last held by %s)", cell(v.Owner)))
	}
	row("fingerprint", v.Fingerprint)
	row("trace", cellIf(v.Trace))
	row("resend", v.Resend)
	if !body {
		names := make([]string, len(v.HeaderNames))
		for i, k := range v.HeaderNames {
			names[i] = cell(k)
		}
		row("headers", strings.Join(names, ", "))
	} else {
		for _, k := range v.HeaderNames {
			vals := make([]string, len(v.Header[k]))
			for i, hv := range v.Header[k] { // v.Header is redacted
				vals[i] = cellIf(hv)
			}
			row("header "+cell(k), strings.Join(vals, ", "))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := c.printHistory(v.History); err != nil {
		return err
	}
	switch {
	case !body:
	case v.Body != nil:
		fmt.Fprintf(c.out, "\n%s\n", *v.Body)
	case v.BodyBase64 != nil:
		fmt.Fprintf(c.out, "\nbody (base64):\n%s\n", *v.BodyBase64)
	default:
		fmt.Fprintln(c.out, "\n(no body journaled: a finished operation keeps none)")
	}
	return nil
}

// printHistory prints an operation's recorded attempts, one line each:
// when, the requests written, the status or error, and the reason.
func (c *cli) printHistory(h []attemptView) error {
	if len(h) == 0 {
		return nil
	}
	fmt.Fprintf(c.out, "\nhistory (attempts that were retried or left it in doubt, oldest first; the newest %d are kept):\n", idem.MaxHistory)
	tw := c.table()
	for _, a := range h {
		outcome := "status " + strconv.Itoa(a.Status)
		if a.Error != "" { // no response came; Status is an earlier one's
			outcome = "error " + cellIf(a.Error)
		}
		reason := "-"
		if a.Reason != "" {
			reason = cellIf(a.Reason)
		}
		fmt.Fprintf(tw, "  %s\tsent %d\t%s\treason %s\n", a.At.Format("2006-01-02T15:04:05.000Z07:00"), a.Sent, outcome, reason)
	}
	return tw.Flush()
}

// expire marks a pending operation expired.
func (c *cli) expire(arg string) (err error) {
	s, err := c.open()
	if err != nil {
		return err
	}
	defer closeStore(s, &err)
	op, err := find(c.ctx, s, arg)
	if err != nil {
		return err
	}
	if op.State != idem.StatePending {
		return fmt.Errorf("operation %s is %s, not pending: nothing to expire", op.Key, op.State)
	}
	// The outcome is written only for the record's holder
	// (KeyStore.Finish): the command itself once it took the operation on
	// a shared journal, else the owner the record names (the journal is
	// the command's alone while it is open).
	holder := op.Owner
	if c.shared() {
		// A replica may be sending it: take it under a lease of the
		// command's own first, as a replica's Resume would.
		if err := c.take(s, op); err != nil {
			return err
		}
		holder = owner()
	}
	if err := s.Finish(c.ctx, op.Key, idem.Outcome{State: idem.StateExpired, Status: op.LastStatus, Err: "expired by operator", URL: idem.TrimQuery(op.URL), At: c.storeNow(s), Owner: holder}); err != nil {
		return err
	}
	if err := s.Close(); err != nil { // Finish is durable once Close returns
		return err
	}
	if c.json {
		return c.writeJSON(map[string]string{"key": op.Key, "name": op.Name, "state": idem.StateExpired.String()})
	}
	fmt.Fprintf(c.out, "expired %s", op.Key)
	if op.Name != "" {
		fmt.Fprintf(c.out, " (%s)", op.Name)
	}
	fmt.Fprintln(c.out, ": it will not be sent again; reconcile it with the server by its key.")
	return nil
}

// gc deletes finished operations last changed before retention ago (the
// journal's retention if it is negative), or with dryRun lists them. A
// retention below the journal's floor (its resend window plus
// idem.RetentionMargin) is refused: it would delete the name → key
// mappings a re-drive needs.
func (c *cli) gc(retention time.Duration, dryRun bool) (err error) {
	s, err := c.open()
	if err != nil {
		return err
	}
	defer closeStore(s, &err)
	if err := c.needPolicy("gc"); err != nil {
		return err
	}
	if retention < 0 {
		retention = c.policy.Retention
	}
	if floor := c.policy.RetentionFloor(); retention < floor {
		return usageError(fmt.Sprintf("gc: --retention %s is below the journal's floor of %s (its resend window of %s plus %s): "+
			"a named operation re-driven within the window would get a new key", retention, floor, c.policy.ResendWindow, idem.RetentionMargin))
	}
	cutoff := c.now.Add(-retention)
	if dryRun {
		return c.gcDryRun(s, cutoff)
	}
	n, err := s.Sweep(c.ctx, cutoff)
	if err != nil {
		return err
	}
	if c.json {
		return c.writeJSON(map[string]any{"swept": n, "cutoff": cutoff})
	}
	fmt.Fprintf(c.out, "swept %d finished operations last changed before %s\n", n, cutoff.Format(time.RFC3339))
	return nil
}

// gcDryRun lists the finished operations a sweep at cutoff would delete.
func (c *cli) gcDryRun(s idem.KeyStore, cutoff time.Time) error {
	every, err := allRecords(c.ctx, s)
	if err != nil && len(every) == 0 {
		return err
	}
	l := listing{Operations: []opView{}}
	for _, op := range every {
		if op.State.Finished() && op.Updated.Before(cutoff) {
			l.Operations = append(l.Operations, c.view(op, false, false))
		}
	}
	if err != nil {
		l.Error = err.Error()
	}
	if c.json {
		return c.writeJSON(map[string]any{"would_sweep": len(l.Operations), "cutoff": cutoff, "operations": l.Operations})
	}
	return c.printListing(l, "KEY\tNAME\tSTATE\tURL\tAGE", func(v opView) string {
		return fmt.Sprintf("%s\t%s\t%s\t%s\t%s", cell(v.Key), listCell(dash(v.Name)), v.State, listCell(dash(v.URL)), age(v.AgeSeconds))
	}, fmt.Sprintf("would sweep %d finished operations last changed before %s (dry run: nothing deleted)", len(l.Operations), cutoff.Format(time.RFC3339)))
}

// statsView is stats' JSON form.
type statsView struct {
	// FileSize is a bbolt journal's size; 0 for a PostgreSQL journal.
	FileSize int64 `json:"file_size_bytes"`
	// ByState counts the readable operations by state.
	ByState    map[string]int `json:"by_state"`
	Unreadable int            `json:"unreadable"`
	// OldestPending is when the oldest pending operation was created.
	OldestPending    *time.Time `json:"oldest_pending,omitempty"`
	OldestPendingAge float64    `json:"oldest_pending_age_seconds,omitempty"`
	// PastResendWindow counts pending operations older than the journal's
	// resend window: Resume expires them instead of sending them.
	PastResendWindow int `json:"past_resend_window"`
	NeedCredentials  int `json:"need_credentials"`
}

// stats counts what the journal holds.
func (c *cli) stats(_ []string) (err error) {
	s, err := c.openSalvage()
	if err != nil {
		return err
	}
	defer closeStore(s, &err)
	var size int64
	if !c.shared() {
		fi, err := os.Stat(c.journal)
		if err != nil {
			return err
		}
		size = fi.Size()
	}
	ops, perr := salvagePending(c.ctx, s)
	if perr != nil && len(ops) == 0 {
		return perr
	}
	st := statsView{FileSize: size, ByState: map[string]int{idem.StatePending.String(): 0}}
	every, werr := allRecords(c.ctx, s)
	if werr != nil && len(every) == 0 {
		return werr
	}
	for _, op := range every {
		if op.State.Finished() {
			st.ByState[op.State.String()]++
		}
	}
	var oldest time.Time
	for _, op := range ops {
		if op.State == 0 {
			st.Unreadable++
			continue
		}
		st.ByState[op.State.String()]++
		if oldest.IsZero() || op.Created.Before(oldest) {
			oldest = op.Created
		}
		switch c.resend(op) {
		case "past resend window":
			st.PastResendWindow++
		case "needs credentials":
			st.NeedCredentials++
		}
	}
	if !oldest.IsZero() {
		st.OldestPending = &oldest
		st.OldestPendingAge = max(c.now.Sub(oldest), 0).Seconds()
	}
	if c.json {
		if err := c.writeJSON(st); err != nil {
			return err
		}
	} else {
		tw := c.table()
		if c.shared() {
			fmt.Fprintf(tw, "journal\t%s\n", c.where())
		} else {
			fmt.Fprintf(tw, "file\t%s (%d bytes)\n", c.journal, st.FileSize)
		}
		fmt.Fprintf(tw, "pending\t%d\n", st.ByState["pending"])
		if st.OldestPending != nil {
			fmt.Fprintf(tw, "oldest pending\t%s old (created %s)\n", age(st.OldestPendingAge), st.OldestPending.Format(time.RFC3339))
		}
		fmt.Fprintf(tw, "past resend window\t%d\n", st.PastResendWindow)
		fmt.Fprintf(tw, "need credentials\t%d\n", st.NeedCredentials)
		if st.Unreadable > 0 {
			fmt.Fprintf(tw, "unreadable\t%d\n", st.Unreadable)
		}
		for _, state := range []idem.State{idem.StateSucceeded, idem.StateFailed, idem.StateExpired} {
			fmt.Fprintf(tw, "%s\t%d\n", state, st.ByState[state.String()])
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if perr != nil {
		return fmt.Errorf("%d pending records could not be read: %w", st.Unreadable, perr)
	}
	return nil
}
