package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/idemgo/idem"
)

// resumeOptions are resume's flags.
type resumeOptions struct {
	concurrency int
	window      time.Duration // 0: the journal's
	headerFile  string
}

// resumeResult is one operation's outcome in resume's output.
type resumeResult struct {
	Key    string `json:"key"`
	Name   string `json:"name,omitempty"`
	State  string `json:"state"`
	Status int    `json:"status,omitempty"`
	Error  string `json:"error,omitempty"`
	// Outcome is a word for the table: "succeeded", "failed" (a request
	// went out, or should have, and did not succeed), "needs credentials",
	// "expired", "not resendable", "unreadable".
	Outcome string `json:"outcome"`
	// Sent reports that a request went out for it.
	Sent bool `json:"sent"`
}

// resumeSummary counts resume's outcomes.
type resumeSummary struct {
	Sent      int `json:"sent"`
	Succeeded int `json:"succeeded"`
	Failed    int `json:"failed"`
	Skipped   int `json:"skipped"` // needs credentials, or not resendable
	Expired   int `json:"expired"`
}

// errResumeFailed is returned by resume when an operation failed, after
// printing the summary.
var errResumeFailed = errors.New("some operations failed")

// commandStore is the journal as the command's Client sees it: the
// command never sweeps (only gc does) and never writes its own policy
// over the application's. It passes on the store's policy (resume needs
// one) and when it last changed.
type commandStore struct{ idem.KeyStore }

func (commandStore) Sweep(context.Context, time.Time) (int, error) { return 0, nil }
func (commandStore) SetPolicy(context.Context, idem.Policy) error  { return nil }

// Policy passes on the store's policy; resume checks first that the store
// keeps one.
func (s commandStore) Policy(ctx context.Context) (idem.Policy, error) {
	ps, ok := s.KeyStore.(idem.PolicyStore)
	if !ok {
		return idem.Policy{}, nil
	}
	return ps.Policy(ctx)
}

// LastChange passes on the store's, if it knows (the zero time otherwise,
// as for an empty journal: the command sweeps nothing anyway).
func (s commandStore) LastChange(ctx context.Context) (time.Time, error) {
	if lc, ok := s.KeyStore.(idem.LastChanger); ok {
		return lc.LastChange(ctx)
	}
	return time.Time{}, nil
}

// clockedStore is a commandStore on a store with a clock of its own (a
// shared journal's): the command's leases are judged by it.
type clockedStore struct {
	commandStore
	clock idem.Clock
}

func (s clockedStore) Now(ctx context.Context) (time.Time, error) { return s.clock.Now(ctx) }

// forCommand wraps s for the command's Client.
func forCommand(s idem.KeyStore) idem.KeyStore {
	if clock, ok := s.(idem.Clock); ok {
		return clockedStore{commandStore{s}, clock}
	}
	return commandStore{s}
}

// resume sends the pending operations again through a Client on the
// journal, under the journal's policy: each key in the header its
// operation was sent with, nothing older than the journal's resend window.
// Operations whose credentials were not journaled are skipped unless
// --header-file gives them.
func (c *cli) resume(o resumeOptions) error {
	var creds []credential
	if o.headerFile != "" {
		var err error
		if creds, err = readHeaderFile(o.headerFile, os.LookupEnv); err != nil {
			return usageError(fmt.Sprintf("resume: --header-file: %v", err))
		}
	}
	s, err := c.open()
	if err != nil {
		return err
	}
	if err := c.needPolicy("resume"); err != nil {
		_ = s.Close()
		return err
	}
	window := c.policy.ResendWindow
	if o.window > 0 {
		if o.window > window {
			_ = s.Close()
			return usageError(fmt.Sprintf("resume: --resend-window %s is longer than the journal's resend window of %s: it may only be shorter", o.window, window))
		}
		window = o.window
	}
	opts := []idem.Option{
		idem.WithResumeConcurrency(o.concurrency),
		idem.WithKeyHeader(c.policy.KeyHeader), // for records that do not say theirs
		idem.WithResendWindow(window),
		idem.WithRetention(c.policy.Retention),
		idem.WithResendMatchWindow(0),
	}
	if c.shared() {
		// One more owner of the shared journal, with a lease of its own:
		// Resume takes only what no running replica holds.
		opts = append(opts, idem.WithOwner(owner()), idem.WithLease(commandLease))
	}
	if creds != nil {
		opts = append(opts, idem.WithResumePrepare(func(r *http.Request) error {
			for _, cr := range creds {
				// Only headers the resend lacks (the credentials that were
				// not journaled): never the key header, never a journaled one.
				if _, has := r.Header[cr.name]; has {
					continue
				}
				if cr.host == "" || strings.EqualFold(cr.host, r.URL.Hostname()) {
					r.Header.Set(cr.name, cr.value)
				}
			}
			return nil
		}))
	}
	client := idem.New(forCommand(s), opts...)
	var (
		mu      sync.Mutex
		results = []resumeResult{}
		sum     resumeSummary
	)
	rerr := client.Resume(c.ctx, func(op idem.Operation, resp *http.Response, err error) {
		r := resumeResult{Key: op.Key, Name: op.Name, State: op.State.String()}
		var ie *idem.Error
		switch {
		case resp != nil:
			resp.Body.Close() // the caller "received" the answer: it settles
			r.Status, r.Sent = resp.StatusCode, true
			r.Outcome = "failed"
			if resp.StatusCode < 400 {
				r.Outcome = "succeeded"
			}
		case errors.Is(err, idem.ErrNoCredentials):
			r.Outcome = "needs credentials"
		case errors.Is(err, idem.ErrExpired):
			r.Outcome = "expired"
		case errors.Is(err, idem.ErrNotRetryable) && errors.As(err, &ie) && ie.Attempts == 0:
			r.Outcome = "not resendable"
		case errors.Is(err, idem.ErrJournalCorrupt), errors.Is(err, idem.ErrRecordVersion):
			r.Outcome = "unreadable"
		default:
			r.Outcome = "failed"
			r.Sent = errors.As(err, &ie) && ie.Attempts > 0
		}
		if err != nil {
			r.Error = err.Error()
		}
		mu.Lock()
		defer mu.Unlock()
		results = append(results, r)
		if r.Sent {
			sum.Sent++
		}
		switch r.Outcome {
		case "succeeded":
			sum.Succeeded++
		case "failed", "unreadable":
			sum.Failed++
		case "expired":
			sum.Expired++
		default:
			sum.Skipped++
		}
	})
	if c.shared() {
		c.release(s, results)
	}
	if err := client.Close(); err != nil {
		rerr = errors.Join(rerr, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if sum.Failed > 0 {
		rerr = errors.Join(rerr, fmt.Errorf("resume: %d of %d operations failed: %w", sum.Failed, len(results), errResumeFailed))
	}
	if c.json {
		if err := c.writeJSON(map[string]any{"operations": results, "summary": sum}); err != nil {
			return err
		}
		return rerr
	}
	tw := c.table()
	fmt.Fprintln(tw, "KEY\tNAME\tOUTCOME\tSTATE\tSTATUS")
	for _, r := range results {
		status := "-"
		if r.Status != 0 {
			status = fmt.Sprint(r.Status)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", cell(r.Key), listCell(dash(r.Name)), r.Outcome, r.State, status)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(c.out, "%d pending: %d sent, %d succeeded, %d failed, %d skipped, %d expired.\n",
		len(results), sum.Sent, sum.Succeeded, sum.Failed, sum.Skipped, sum.Expired)
	for _, r := range results {
		if r.Outcome == "needs credentials" {
			fmt.Fprintln(c.out, "Operations that need credentials stay pending: give them with --header-file, or let the application resume them with its WithResumePrepare hook.")
			break
		}
	}
	return rerr
}

// credential is one header of a --header-file.
type credential struct {
	host        string // "" for every host
	name, value string
}

// readHeaderFile reads a file of "Name: value" lines (blank lines and
// lines starting with # are skipped). A line may start with "[host] " to
// apply to that host only. A value may name environment variables as
// ${VAR}, so that the file need not hold the secret itself. Errors name
// the line, never a value.
func readHeaderFile(path string, env func(string) (string, bool)) ([]credential, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []credential
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		var cr credential
		if rest, ok := strings.CutPrefix(line, "["); ok {
			host, after, ok := strings.Cut(rest, "]")
			if !ok || host == "" {
				return nil, fmt.Errorf("%s:%d: a [host] prefix without its closing bracket", path, n)
			}
			cr.host, line = host, strings.TrimSpace(after)
		}
		name, value, ok := strings.Cut(line, ":")
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if !ok || name == "" || strings.ContainsAny(name, " \t") {
			return nil, fmt.Errorf("%s:%d: not a \"Name: value\" line", path, n)
		}
		var missing string
		value = os.Expand(value, func(v string) string {
			s, ok := env(v)
			if !ok && missing == "" {
				missing = v
			}
			return s
		})
		if missing != "" {
			return nil, fmt.Errorf("%s:%d: environment variable %s is not set", path, n, missing)
		}
		if strings.ContainsAny(value, "\r\n") {
			return nil, fmt.Errorf("%s:%d: the value of %s holds a line break", path, n, name)
		}
		cr.name, cr.value = http.CanonicalHeaderKey(name), value
		out = append(out, cr)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no headers", path)
	}
	return out, nil
}

// release gives back (giveBack) the operations resume took and left
// pending: skipped, or failed without an answer.
func (c *cli) release(s idem.KeyStore, results []resumeResult) {
	now := c.storeNow(s)
	for _, r := range results {
		if r.State != idem.StatePending.String() {
			continue
		}
		err := c.giveBack(s, r.Key, now)
		if err != nil && !errors.Is(err, idem.ErrLeaseLost) && !errors.Is(err, idem.ErrNotFound) {
			fmt.Fprintf(c.err, "idem: releasing operation %s: %v (its lease lapses within %s)\n", cell(r.Key), err, commandLease)
		}
	}
}
