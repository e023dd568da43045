package main

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemgo/idem"
)

// opView is an operation as the command prints it. Header values and the
// body are filled in only for show --body.
type opView struct {
	Key         string    `json:"key"`
	Name        string    `json:"name,omitempty"`
	State       string    `json:"state"`
	Method      string    `json:"method,omitempty"`
	URL         string    `json:"url,omitempty"`
	Host        string    `json:"host,omitempty"`
	Attempts    int       `json:"attempts"`
	LastStatus  int       `json:"last_status,omitempty"`
	LastError   string    `json:"last_error,omitempty"`
	Created     time.Time `json:"created,omitzero"`
	Updated     time.Time `json:"updated,omitzero"`
	AgeSeconds  float64   `json:"age_seconds"`
	Owner       string    `json:"owner,omitempty"`
	LeaseUntil  time.Time `json:"lease_until,omitzero"`
	Fingerprint string    `json:"fingerprint,omitempty"`
	// Resend says whether Resume can send a pending operation again:
	// "yes", "needs credentials", "body not journaled", "past resend
	// window", "unreadable", or, on a shared journal, "leased: a replica
	// may be sending it" (under a live lease of another owner).
	Resend       string      `json:"resend,omitempty"`
	Redacted     bool        `json:"redacted,omitempty"`
	Unreplayable bool        `json:"unreplayable,omitempty"`
	HeaderNames  []string    `json:"header_names,omitempty"`
	Header       http.Header `json:"header,omitempty"`
	Body         *string     `json:"body,omitempty"`
	BodyBase64   *string     `json:"body_base64,omitempty"`
	// Trace is the W3C traceparent the operation was journaled under.
	Trace string `json:"trace,omitempty"`
	// History is the recorded attempts, oldest first (show only).
	History []attemptView `json:"history,omitempty"`
}

// attemptView is one attempt of an operation's history as show prints
// it: when it was recorded, the requests it wrote, its error (when no
// response came) or else its status, and why it did not end the
// operation. Status is the last response's, as in idem.Attempt: with an
// error, it is an earlier attempt's (or 0).
type attemptView struct {
	At     time.Time `json:"at"`
	Sent   int       `json:"sent"`
	Status int       `json:"status,omitempty"`
	Error  string    `json:"error,omitempty"`
	Reason string    `json:"reason,omitempty"`
}

func historyView(h []idem.Attempt) []attemptView {
	if len(h) == 0 {
		return nil
	}
	out := make([]attemptView, len(h))
	for i, a := range h {
		out[i] = attemptView{At: a.At, Sent: a.Sent, Status: a.Status, Error: a.Err, Reason: a.Reason}
	}
	return out
}

func (c *cli) view(op idem.Operation, fullURL, body bool) opView {
	v := opView{
		Key: op.Key, Name: op.Name, State: op.State.String(), Method: op.Method, URL: idem.TrimQuery(op.URL), Host: op.Host,
		Attempts: op.Attempts, LastStatus: op.LastStatus, LastError: op.LastError,
		Created: op.Created, Updated: op.Updated, Owner: op.Owner, LeaseUntil: op.LeaseUntil,
		Redacted: op.Redacted, Unreplayable: op.Unreplayable,
	}
	if fullURL {
		v.URL = op.URL
	}
	if !op.Created.IsZero() {
		v.AgeSeconds = max(c.now.Sub(op.Created), 0).Seconds()
	}
	if op.Fingerprint != ([32]byte{}) {
		v.Fingerprint = hex.EncodeToString(op.Fingerprint[:])
	}
	switch {
	case op.State == 0:
		v.State, v.Resend = "unreadable", "unreadable"
	case op.State != idem.StatePending:
	case c.shared() && op.Owner != "" && op.LeaseUntil.After(c.now):
		v.Resend = "leased: a replica may be sending it"
	case op.Created.Before(c.now.Add(-c.policy.ResendWindow)):
		v.Resend = "past resend window"
	case op.Unreplayable:
		v.Resend = "body not journaled"
	case op.Redacted:
		v.Resend = "needs credentials"
	default:
		v.Resend = "yes"
	}
	v.HeaderNames = sortedKeys(op.Header)
	if body {
		v.Header = op.Header
		if op.Body != nil {
			if s := string(op.Body); utf8.ValidString(s) {
				v.Body = &s
			} else {
				b := base64.StdEncoding.EncodeToString(op.Body)
				v.BodyBase64 = &b
			}
		}
	}
	return v
}

// age formats a duration in seconds for a table, rounded to its two
// largest units: 42s, 16m, 2h3m, 3d4h.
func age(seconds float64) string {
	d := time.Duration(seconds * float64(time.Second))
	switch {
	case d >= 48*time.Hour:
		d = d.Round(time.Hour)
		return fmt.Sprintf("%dd%dh", d/(24*time.Hour), d%(24*time.Hour)/time.Hour)
	case d >= time.Hour:
		d = d.Round(time.Minute)
		return fmt.Sprintf("%dh%dm", d/time.Hour, d%time.Hour/time.Minute)
	case d >= time.Minute:
		return fmt.Sprintf("%dm", d.Round(time.Minute)/time.Minute)
	}
	return fmt.Sprintf("%ds", d.Round(time.Second)/time.Second)
}

// last is an operation's last outcome for a table.
func last(v opView) string {
	var parts []string
	if v.LastStatus != 0 {
		parts = append(parts, fmt.Sprint(v.LastStatus))
	}
	if v.LastError != "" {
		e := v.LastError
		if len(e) > 60 {
			e = e[:57] + "..."
		}
		parts = append(parts, e)
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

// cell returns s as a table shows it: as it is if it is plain printable
// text, else quoted in Go syntax, so that a name or URL built from user
// input cannot add rows, columns or terminal escape sequences to a table.
// --json output is not quoted: JSON escapes what it must.
func cell(s string) string {
	for _, r := range s {
		if r == ' ' || r == '"' || r == '\\' || !unicode.IsGraphic(r) || r == utf8.RuneError {
			return strconv.Quote(s)
		}
	}
	return s
}

// maxCell bounds, in bytes, a name or URL in a list's table: a longer one
// (a name may have 1024 bytes) is cut, with its length, so that one row
// does not push every other off the screen. show and --json print it whole.
const maxCell = 96

// listCell is cell for a name or URL in a list's table, cut to maxCell.
func listCell(s string) string {
	if len(s) <= maxCell {
		return cell(s)
	}
	cut := maxCell - 32
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return cell(s[:cut]) + fmt.Sprintf("…(%d bytes)", len(s))
}

// cellIf is cell for a value shown on its own: spaces alone do not make
// it quoted.
func cellIf(s string) string {
	if s == "" {
		return ""
	}
	if q := cell(strings.ReplaceAll(s, " ", "_")); q != strings.ReplaceAll(s, " ", "_") {
		return strconv.Quote(s)
	}
	return s
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (c *cli) writeJSON(v any) error {
	enc := json.NewEncoder(c.out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (c *cli) table() *tabwriter.Writer { return tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0) }

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
	row("last error", cellIf(v.LastError))
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
			vals := make([]string, len(op.Header[k]))
			for i, hv := range op.Header[k] {
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
	if c.shared() {
		// A replica may be sending it: take it under a lease of the
		// command's own first, as a replica's Resume would.
		if err := c.take(s, op); err != nil {
			return err
		}
	}
	if err := s.Finish(c.ctx, op.Key, idem.Outcome{State: idem.StateExpired, Status: op.LastStatus, Err: "expired by operator", URL: idem.TrimQuery(op.URL), At: c.storeNow(s)}); err != nil {
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
// journal's retention if it is negative), or with dryRun lists them. A retention below the journal's floor (its
// resend window plus idem.RetentionMargin) is refused: it would delete
// the name → key mappings a re-drive needs.
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
		switch c.view(op, false, false).Resend {
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
