// Command idem reads and tends an idem journal: the bbolt file that
// idem.Open and idem.OpenBoltStore use, or the PostgreSQL journal of
// package pgstore that an application's replicas share. It lists and shows
// operations, resumes or expires the pending ones, sweeps old finished
// ones, checks a file for damage and counts what the journal holds; and
// "idem check" asks an API whether it honours keys (it needs no journal).
//
// Usage:
//
//	idem [flags] COMMAND [command flags] [ARGS]
//
// Run "idem -h" for the commands and flags. The journal is named with
// --journal (a path, or a postgres:// URL) or the IDEM_JOURNAL environment
// variable. A running application holds a bbolt journal's lock: the
// command then exits with status 3 and points to the application's live
// page (package idemstatus). A PostgreSQL journal is shared: the command
// is one more owner there, with a lease of its own, and never takes an
// operation a running replica holds.
//
// Nothing idem journals is secret (credentials are never written), and the
// command prints no request headers' values or bodies unless asked with
// show --body.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/pgstore"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := runContext(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit statuses.
const (
	exitOK     = 0
	exitFailed = 1 // the command failed, or verify found damage
	exitUsage  = 2
	exitLocked = 3 // the journal is held by a running application
)

// envJournal names the journal when --journal is not given.
const envJournal = "IDEM_JOURNAL"

const usageText = `usage: idem [--journal PATH|URL] [--schema NAME] [--json] [--lock-timeout D] COMMAND [ARGS]

Reads and tends an idem journal: the bbolt file of idem.Open, or a
PostgreSQL journal (package pgstore) that an application's replicas share.

Commands:
  ls                 list every operation, pending and finished, one line each
  show KEY|NAME      show one operation (finished ones too) and the history
                     of its retried attempts [--body: with its journaled
                     request headers and body]
  pending            the pending operations in detail: last outcome, lease,
                     whether Resume can send them
  resume             send the pending operations again with their keys, in
                     the header each was sent with, under the journal's
                     resend window, and finish them; operations whose
                     credentials were not journaled are skipped ("needs
                     credentials") unless --header-file gives them
                     [--header-file FILE] [--resend-window D, only shorter]
                     [--concurrency N]; exits 1 if any failed
  expire KEY|NAME    give up a pending operation: mark it expired, never to
                     be sent again ("expired by operator")
  gc                 delete finished operations last changed before
                     --retention ago (default: the journal's retention;
                     never below its floor, the resend window plus 1h)
                     [--retention D] [--dry-run: list, delete nothing]
  verify             check the file page by page and read every pending
                     operation; exits 1 on damage (bbolt files only:
                     PostgreSQL checks its own pages)
  stats              counts, oldest pending operation, file size
  check URL          does an API honour keys? (no journal; idem check -h)
  help [COMMAND]     this text, or a command's flags

The command acts under the policy the application journaled (key header,
resend window, retention); its flags may only be stricter. Tables quote
names and URLs that hold spaces, quotes or control characters (Go syntax),
and lists cut those over 96 bytes; show and --json print them whole.

Flags:
  --journal PATH|URL the journal: a bbolt file, or a postgres:// (or
                     postgresql://) URL; put the password in PGPASSWORD
                     rather than the URL (default $IDEM_JOURNAL)
  --schema NAME      a PostgreSQL journal's schema (pgstore.WithSchema;
                     default idem)
  --json             print JSON instead of tables, for scripts
  --lock-timeout D   how long to wait for a bbolt journal's lock (default 1s)

A bbolt journal has one user at a time: while an application has it open,
the command exits with status 3; look at the application's live page
(idemstatus.Handler) instead, or stop the application.

A PostgreSQL journal is shared: the command may run beside the replicas.
resume is one more owner there, with a lease of its own: it takes only
operations whose lease has lapsed (their replica died) and never one a
running replica holds; expire refuses an operation under a live lease.

Exit status: 0 done, 1 failed or damage found, 2 usage, 3 journal in use.
`

// cli is one run of the command.
type cli struct {
	ctx         context.Context
	journal     string
	json        bool
	lockTimeout time.Duration
	out, err    io.Writer
	now         time.Time
	// policy is the journal's (idem.PolicyStore), completed with the
	// defaults for what it does not say; open reads it.
	policy idem.Policy
	// hasPolicy reports that the store keeps a policy (idem.PolicyStore),
	// stored or not yet.
	hasPolicy bool
	// schema is the PostgreSQL schema of a shared journal.
	schema string
	// cmd is the command being run, once known: usage errors point to
	// its help.
	cmd string
}

// command is one subcommand: its flags are set up by flags, its arguments
// counted by nargs, and run does the work.
type command struct {
	args  string // the arguments in the usage line
	nargs int
	flags func(fs *flag.FlagSet) func(*cli, []string) error
}

var commands = map[string]command{
	"ls":      {"", 0, func(fs *flag.FlagSet) func(*cli, []string) error { return (*cli).ls }},
	"pending": {"", 0, func(fs *flag.FlagSet) func(*cli, []string) error { return (*cli).pending }},
	"show": {"KEY|NAME", 1, func(fs *flag.FlagSet) func(*cli, []string) error {
		body := fs.Bool("body", false, "print the journaled request headers and body")
		return func(c *cli, args []string) error { return c.show(args[0], *body) }
	}},
	"resume": {"", 0, func(fs *flag.FlagSet) func(*cli, []string) error {
		var o resumeOptions
		fs.IntVar(&o.concurrency, "concurrency", 8, "operations sent at once")
		fs.DurationVar(&o.window, "resend-window", 0, "send only operations younger than this; it may only be shorter than the journal's (default: the journal's)")
		fs.StringVar(&o.headerFile, "header-file", "", "a `FILE` of \"Name: value\" lines added to every resend, for credentials; ${VAR} takes a value from the environment, and a line may start with [host] to apply to that host only")
		return func(c *cli, _ []string) error { return c.resume(o) }
	}},
	"expire": {"KEY|NAME", 1, func(fs *flag.FlagSet) func(*cli, []string) error {
		return func(c *cli, args []string) error { return c.expire(args[0]) }
	}},
	"gc": {"", 0, func(fs *flag.FlagSet) func(*cli, []string) error {
		r := fs.Duration("retention", 0, "keep finished operations changed within this long; never below the journal's floor (default: the journal's retention)")
		dry := fs.Bool("dry-run", false, "list what would be deleted, delete nothing")
		return func(c *cli, _ []string) error {
			retention := time.Duration(-1) // the journal's
			fs.Visit(func(f *flag.Flag) {
				if f.Name == "retention" {
					retention = *r
				}
			})
			return c.gc(retention, *dry)
		}
	}},
	"verify": {"", 0, func(fs *flag.FlagSet) func(*cli, []string) error { return (*cli).verify }},
	"stats":  {"", 0, func(fs *flag.FlagSet) func(*cli, []string) error { return (*cli).stats }},
}

// run runs the command with args (without the program name) and returns
// its exit status.
func run(args []string, stdout, stderr io.Writer) int {
	return runContext(context.Background(), args, stdout, stderr)
}

func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "check" { // needs no journal: see check.go
		return checkCmd(ctx, args[1:], stdout, stderr)
	}
	c := &cli{ctx: ctx, out: stdout, err: stderr, now: time.Now()}
	fs := flag.NewFlagSet("idem", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.journal, "journal", os.Getenv(envJournal), "")
	fs.BoolVar(&c.json, "json", false, "")
	fs.DurationVar(&c.lockTimeout, "lock-timeout", time.Second, "")
	fs.StringVar(&c.schema, "schema", pgstore.DefaultSchema, "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, usageText)
			return exitOK
		}
		return c.usage(err.Error())
	}
	if msg := negativeFlag(fs); msg != "" {
		return c.usage(msg)
	}
	if fs.NArg() == 0 {
		return c.usage("no command")
	}
	name, rest := fs.Arg(0), fs.Args()[1:]
	if name == "help" {
		if len(rest) == 0 {
			fmt.Fprint(stdout, usageText)
			return exitOK
		}
		name, rest = rest[0], []string{"--help"}
		if name == "check" {
			return checkCmd(ctx, rest, stdout, stderr)
		}
	}
	cmd, ok := commands[name]
	if !ok {
		return c.usage(fmt.Sprintf("unknown command %q", name))
	}
	c.cmd = name
	sub := flag.NewFlagSet("idem "+name, flag.ContinueOnError)
	sub.SetOutput(io.Discard)
	sub.BoolVar(&c.json, "json", c.json, "print JSON")
	do := cmd.flags(sub)
	args, err := parseInterspersed(sub, rest)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stdout, "usage: idem [--journal PATH|URL] %s [flags] %s\n", name, cmd.args)
			printFlags(stdout, sub)
			return exitOK
		}
		return c.usage(fmt.Sprintf("%s: %v", name, err))
	}
	if msg := negativeFlag(sub); msg != "" {
		return c.usage(name + ": " + msg)
	}
	if len(args) != cmd.nargs {
		return c.usage(fmt.Sprintf("%s takes %d argument(s) (%s), got %d", name, cmd.nargs, cmd.args, len(args)))
	}
	if c.journal == "" {
		return c.usage("no journal: use --journal PATH (or postgres://...) or set " + envJournal)
	}
	if err := do(c, args); err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			return c.usage(string(ue))
		}
		return c.fail(err)
	}
	return exitOK
}

// usageError is an error a command returns for flags that make no sense
// for the journal: the command exits with exitUsage.
type usageError string

func (e usageError) Error() string { return string(e) }

// negativeFlag returns a usage message for a duration or count given a
// negative value (every one of the command's is a length, a wait or a
// number of workers), or "".
func negativeFlag(fs *flag.FlagSet) (msg string) {
	fs.Visit(func(f *flag.Flag) {
		g, ok := f.Value.(flag.Getter)
		if !ok || msg != "" {
			return
		}
		switch v := g.Get().(type) {
		case time.Duration:
			if v < 0 {
				msg = fmt.Sprintf("--%s must not be negative, got %s", f.Name, v)
			}
		case int:
			if v < 0 {
				msg = fmt.Sprintf("--%s must not be negative, got %d", f.Name, v)
			}
		}
	})
	return msg
}

// usage prints msg and where the help is, in one line, and returns the
// exit status of a usage error.
func (c *cli) usage(msg string) int {
	see := "idem help"
	if c.cmd != "" {
		see += " " + c.cmd
	}
	fmt.Fprintf(c.err, "idem: %s (see %s)\n", msg, see)
	return exitUsage
}

// parseInterspersed parses a command's flags wherever they stand among
// its arguments ("show KEY --body" as "show --body KEY"; "--" ends the
// flags) and returns the arguments.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var out []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return out, nil
		}
		if i := len(args) - len(rest) - 1; i >= 0 && args[i] == "--" {
			return append(out, rest...), nil
		}
		out = append(out, rest[0])
		args = rest[1:]
	}
}

// errDamaged is returned by verify when it found damage, after printing
// what it found.
var errDamaged = errors.New("journal is damaged")

// fail prints err, plainly for the errors an operator meets, and returns
// the exit status.
func (c *cli) fail(err error) int {
	switch {
	case errors.Is(err, idem.ErrJournalLocked):
		fmt.Fprintf(c.err, "idem: journal %s is in use by a running application (or another idem command).\n"+
			"  A journal has one user at a time. See what the application is doing on its live\n"+
			"  page (idemstatus.Handler, often mounted at /debug/idem), or stop it and try again.\n", c.where())
		return exitLocked
	case errors.Is(err, errDamaged):
		fmt.Fprintf(c.err, "idem: journal %s is damaged (see above).\n"+
			"  An application refuses to open a damaged journal. Keep a copy of the file, then\n"+
			"  restore it from a backup or move it aside; its pending operations must be\n"+
			"  reconciled with the servers by their keys.\n", c.where())
	case errors.Is(err, idem.ErrJournalCorrupt), errors.Is(err, idem.ErrRecordVersion):
		if c.shared() {
			fmt.Fprintf(c.err, "idem: %v\n  \"idem ls\" and \"idem pending\" list what is still readable, with the keys to reconcile.\n", err)
			break
		}
		fmt.Fprintf(c.err, "idem: %v\n  Run \"idem --journal %s verify\" for details; \"idem ls\" and \"idem pending\"\n"+
			"  list what is still readable, with the keys to reconcile.\n", err, c.journal)
	default:
		fmt.Fprintf(c.err, "idem: %v\n", err)
	}
	return exitFailed
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// printFlags prints fs's flags as the command spells them, with two
// dashes.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		typ, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if typ != "" {
			line += " " + typ
		}
		fmt.Fprintf(w, "%s\n    \t%s", line, usage)
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "0s" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
}
