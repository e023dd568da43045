package main

// How the command prints an operation: its view, the cells of its
// tables, and its JSON.

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
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
		if u := idem.RedactURL(op.URL); u != "" {
			v.URL = u // a journal of an earlier release may hold a secret parameter
		}
	}
	if !op.Created.IsZero() {
		v.AgeSeconds = max(c.now.Sub(op.Created), 0).Seconds()
	}
	if op.Fingerprint != ([32]byte{}) {
		v.Fingerprint = hex.EncodeToString(op.Fingerprint[:])
	}
	if op.State == 0 {
		v.State = "unreadable"
	}
	v.Resend = c.resend(op)
	v.HeaderNames = sortedKeys(op.Header)
	if body {
		v.Header = idem.RedactHeader(op.Header) // a journal of an earlier release may hold X-Api-Key
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

// resend says whether resume would send op, or why not: "" for an
// operation that is not pending.
func (c *cli) resend(op idem.Operation) string {
	switch {
	case op.State == 0:
		return "unreadable"
	case op.State != idem.StatePending:
		return ""
	case c.shared() && op.Owner != "" && op.LeaseUntil.After(c.now):
		return "leased: a replica may be sending it"
	case op.Created.Before(c.now.Add(-c.policy.ResendWindow)):
		return "past resend window"
	case op.Unreplayable:
		return "body not journaled"
	case op.Redacted:
		return "needs credentials"
	}
	return "yes"
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
