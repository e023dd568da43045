// Command checkout is idem's main demo: a shop pays 100 orders through a
// payment provider that drops connections, loses responses and answers
// 503, 429 and 409; midway the shop process is killed for real and
// restarted, and every order is still charged exactly once.
//
// It shows:
//   - named operations: each payment is idem.WithOperation(ctx,
//     "pay:order-N"), so it keeps one Idempotency-Key across retries,
//     crashes and re-drives;
//   - retries of transient failures with the same key and body, counted by
//     reason from the provider's own counters;
//   - a real crash: the program re-executes itself as the shop and kills it
//     with SIGKILL while the provider holds a payment it has charged but not
//     yet answered — the moment a naive retry charges twice;
//   - the restart: the journal tells the new shop which orders are paid,
//     Client.Resume finishes the payments in flight with their original keys
//     (the provider replays its stored answers), and the rest are paid by
//     name;
//   - WithResumePrepare: credentials are never journaled and are added back
//     to resumed requests;
//   - the proof: the provider's ledger has every order exactly once — the
//     program exits with status 1 if any order is charged twice or never;
//   - with -trace, idem's Hooks: the trace of one order that needed a
//     retry, attempt by attempt, with the same key on each.
//
// The provider is an in-process idemtest server on loopback; nothing needs
// setting up. The journal is kept in a temporary directory for inspection;
// the program prints its path. The driver's plumbing (the pool of payments,
// the tries, the ledger of charges per order) is internal/chaoskit, shared
// with idem's chaos tests.
//
// Run it with: go run ./examples/checkout [-trace]
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemtest"
	"github.com/idemgo/idem/internal/chaoskit"
)

const (
	orders    = 100
	killAfter = orders / 2 // orders paid before the shop is killed
	workers   = 4          // payments the shop has in flight at once
	apiKey    = "Bearer sk_test_shop"

	// The shop is this program re-executed with these variables set.
	envRole    = "IDEM_CHECKOUT_ROLE"
	envJournal = "IDEM_CHECKOUT_JOURNAL"
	envURL     = "IDEM_CHECKOUT_URL"
	roleShop   = "shop"
)

func main() {
	if os.Getenv(envRole) == roleShop {
		os.Exit(shopMain())
	}
	trace := flag.Bool("trace", false, "print the trace of one retried order, from idem's Hooks")
	flag.Parse()
	if *trace {
		os.Setenv(envTrace, "1") // the shops inherit it
	}
	dir, err := os.MkdirTemp("", "idem-checkout-")
	if err != nil {
		log.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		log.Fatal(err)
	}
	if _, err := run(os.Stdout, exe, dir); err != nil {
		log.Fatal(err)
	}
}

// orderName and orderBody are the operation name and payload of order n.
func orderName(n int) string { return "pay:order-" + strconv.Itoa(n) }

func orderBody(n int) string {
	return fmt.Sprintf(`{"order":%d,"amount":%d,"currency":"eur"}`, n, 1000+10*n)
}

// ---------------------------------------------------------------------------
// The shop (child process).

// shopMain is one life of the shop: it pays every order its journal does
// not record as paid. It writes one line per event to stdout for the
// parent: "todo <n>", "resumed <order> <status> <replayed>", "paid <order>
// <status> <replayed>", "closed".
func shopMain() int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := shop(ctx, os.Getenv(envJournal), os.Getenv(envURL)); err != nil {
		fmt.Fprintln(os.Stderr, "shop:", err)
		return 1
	}
	return 0
}

// say writes one line to the parent in a single write.
var sayMu sync.Mutex

func say(format string, args ...any) {
	sayMu.Lock()
	defer sayMu.Unlock()
	fmt.Fprintf(os.Stdout, format+"\n", args...)
}

func shop(ctx context.Context, journal, url string) error {
	paid, err := paidOrders(ctx, journal)
	if err != nil {
		return err
	}
	say("todo %d", orders-len(paid))

	client, err := idem.Open(journal,
		idem.WithBackoff(20*time.Millisecond, 500*time.Millisecond),
		idem.WithResumePrepare(func(r *http.Request) error {
			r.Header.Set("Authorization", apiKey) // never journaled
			return nil
		}))
	if err != nil {
		return err
	}
	defer client.Close()

	// Finish what the crash interrupted, with the original keys.
	var mu sync.Mutex
	err = client.Resume(ctx, func(op idem.Operation, resp *http.Response, err error) {
		n, _ := strconv.Atoi(strings.TrimPrefix(op.Name, "pay:order-"))
		if err != nil {
			say("resumed %d error", n)
			return
		}
		ok := chaoskit.Answer(resp, n)
		say("resumed %d %d %t", n, resp.StatusCode, resp.Header.Get(idemtest.ReplayedHeader) == "true")
		if ok {
			mu.Lock()
			paid[n] = true
			mu.Unlock()
		}
	})
	if err != nil {
		return err
	}

	// Pay the rest by name.
	var tr *tracer
	if os.Getenv(envTrace) != "" {
		tr = &tracer{}
	}
	unpaid := func(yield func(int) bool) {
		for n := 1; n <= orders; n++ {
			mu.Lock()
			done := paid[n]
			mu.Unlock()
			if !done && !yield(n) {
				return
			}
		}
	}
	failed := chaoskit.Pool(workers, unpaid, func(n int) bool {
		return pay(ctx, client.HTTPClient(), url, n, tr)
	})
	if err := client.Close(); err != nil {
		return err
	}
	say("closed")
	if failed > 0 {
		return fmt.Errorf("%d orders could not be paid", failed)
	}
	return nil
}

// paidOrders returns the orders the journal records as paid.
func paidOrders(ctx context.Context, journal string) (map[int]bool, error) {
	store, err := idem.OpenBoltStore(journal, nil)
	if err != nil {
		return nil, err
	}
	defer store.Close()
	done, _, err := chaoskit.Done(ctx, store.Named, chaoskit.Names(orders, func(i int) string { return orderName(i + 1) }))
	if err != nil {
		return nil, err
	}
	paid := make(map[int]bool)
	for i, ok := range done {
		if ok {
			paid[i+1] = true
		}
	}
	return paid, store.Close()
}

// pay pays order n, re-driving it by name a few times if idem returns
// without a charge (attempts ran out on faults); the name keeps the key.
// With a tracer, it says the trace of the first order that was retried.
func pay(ctx context.Context, hc *http.Client, url string, n int, tr *tracer) bool {
	if tr != nil {
		h, o := tr.hooks()
		ctx = idem.WithRequestHooks(ctx, h)
		defer func() {
			if lines := tr.take(o); lines != nil {
				say("trace %s, from idem's hooks:\ntrace %s", orderName(n), strings.Join(lines, "\ntrace "))
			}
		}()
	}
	return chaoskit.Try(ctx, 5, 100*time.Millisecond, func(int) (bool, error) {
		req, err := chaoskit.Post(idem.WithOperation(ctx, orderName(n)), url+"/v1/charges", orderBody(n))
		if err != nil {
			return false, err
		}
		req.Header.Set("Authorization", apiKey)
		resp, err := hc.Do(req)
		if err != nil {
			return false, nil // outcome unknown: the same name is the same key
		}
		if !chaoskit.Answer(resp, n) { // the provider's charge for order n
			return false, nil
		}
		say("paid %d %d %t", n, resp.StatusCode, resp.Header.Get(idemtest.ReplayedHeader) == "true")
		return true, nil
	})
}

// ---------------------------------------------------------------------------
// The demo (parent process): the provider, the crash, the report.

// Report is what the demo found, from the provider's counters and ledger.
type Report struct {
	Orders     int
	Paid       int                    // orders charged at least once
	Attempts   int                    // requests the provider received
	Faults     map[idemtest.Fault]int // faults injected, by kind
	Conflicts  int                    // real 409s: a key still being handled
	Replays    int                    // stored answers replayed
	Resumed    int                    // operations finished by Resume after the crash
	Killed     bool                   // the shop was SIGKILLed mid-payment
	Duplicates int                    // orders charged more than once
	Lost       int                    // orders never charged
	Journal    string
}

// faultRates are the provider's faults, as shares of the requests it gets.
var faultRates = idemtest.FaultRates{
	DropBefore:      0.05,
	DropAfter:       0.08, // charged, response lost
	Delay:           0.03, // answered late, not a failure
	Unavailable:     0.06,
	TooManyRequests: 0.05,
	InProgress:      0.03,
}

// failureRate is the share of requests that fail (a delay is no failure).
func failureRate(r idemtest.FaultRates) float64 {
	return r.DropBefore + r.DropAfter + r.Unavailable + r.TooManyRequests + r.InProgress
}

// provider is the payment provider: an idemtest server whose handler
// charges a card once per run and keeps a ledger. Once hold is set, a
// charge is performed and then held unanswered until release is closed.
type provider struct {
	*idemtest.Server
	mu      sync.Mutex
	ledger  map[int]int // charges per order
	hold    atomic.Bool
	held    chan struct{} // signals a held charge (buffered: one signal is enough)
	release chan struct{}
}

func newProvider() *provider {
	p := &provider{ledger: make(map[int]int), held: make(chan struct{}, 1), release: make(chan struct{})}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != apiKey {
			http.Error(w, "no credentials", http.StatusUnauthorized)
			return
		}
		var c struct{ Order int }
		if err := json.NewDecoder(r.Body).Decode(&c); err != nil || c.Order < 1 {
			http.Error(w, "bad charge", http.StatusBadRequest)
			return
		}
		p.mu.Lock()
		p.ledger[c.Order]++
		p.mu.Unlock()
		if p.hold.Load() {
			select {
			case p.held <- struct{}{}:
			default:
			}
			<-p.release
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ch_%016x","order":%d,"status":"succeeded"}`, rand.Uint64(), c.Order)
	})
	rates := faultRates
	rates.Seed = rand.Uint64()
	p.Server = idemtest.NewServer(h,
		idemtest.WithFaultRates(rates),
		idemtest.WithRetryAfter(0),
		idemtest.WithFaultDelay(50*time.Millisecond))
	return p
}

func (p *provider) close() {
	select {
	case <-p.release:
	default:
		close(p.release)
	}
	p.Close()
}

// shopProc is a running shop process and its lines.
type shopProc struct {
	cmd   *exec.Cmd
	lines chan string
}

func startShop(ctx context.Context, exe, journal, url string) (*shopProc, error) {
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), envRole+"="+roleShop, envJournal+"="+journal, envURL+"="+url)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &shopProc{cmd: cmd, lines: make(chan string, 256)}
	go func() {
		defer close(s.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			s.lines <- sc.Text()
		}
	}()
	return s, nil
}

// run runs the demo with its journal in dir, writing progress and the
// report to w. It returns an error if the demo could not run, or if an
// order was charged twice or never.
func run(w io.Writer, exe, dir string) (Report, error) {
	rep := Report{Orders: orders, Journal: filepath.Join(dir, "journal.db")}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	p := newProvider()
	defer p.close()
	fmt.Fprintf(w, "A shop pays %d orders; the provider fails about %.0f%% of requests (drops, lost answers, 503, 429, 409) and delays %.0f%%.\n",
		orders, 100*failureRate(faultRates), 100*faultRates.Delay)
	fmt.Fprintf(w, "Journal: %s\n\n", rep.Journal)

	paid := make(map[int]bool)
	traced, tracing := false, false // one order's trace was printed; is being printed
	progress := func() {
		if len(paid)%10 == 0 {
			fmt.Fprintf(w, "  paid %3d/%d\n", len(paid), orders)
		}
	}
	// events reads a shop's lines until it closes its output, calling
	// stop (if set) after each; stop returning true ends the reading.
	events := func(s *shopProc, stop func() bool) error {
		for {
			select {
			case line, ok := <-s.lines:
				if !ok {
					return nil
				}
				if strings.HasPrefix(line, "trace ") { // -trace: print one order's trace
					if !traced {
						fmt.Fprintf(w, "    %s\n", strings.TrimPrefix(line, "trace "))
						tracing = true
					}
					continue
				}
				if tracing { // a trace's lines come in one block: it ended
					traced, tracing = true, false
				}
				f := strings.Fields(line)
				switch {
				case len(f) == 2 && f[0] == "todo":
					journaled := orders - atoi(f[1])
					fmt.Fprintf(w, "  the journal says %d orders are paid, %s to go\n", journaled, f[1])
					switch counted := len(paid); {
					case journaled < counted:
						fmt.Fprintf(w, "  (the shop said %d: the finish marks of the last %d answers ride the journal's next commit, which the kill cut off; Resume sends them again with their keys and the provider replays its answers)\n",
							counted, counted-journaled)
					case journaled > counted:
						fmt.Fprintf(w, "  (the shop said %d: it received %d more answers before it died, and did not say so)\n", counted, journaled-counted)
					}
				case len(f) == 4 && f[0] == "resumed":
					rep.Resumed++
					how := "charged now"
					if f[3] == "true" {
						how = "already charged, answer replayed by the provider"
					}
					fmt.Fprintf(w, "  resumed %s with its original key: %s (%s)\n", orderName(atoi(f[1])), f[2], how)
					if !paid[atoi(f[1])] && f[2][0] == '2' {
						paid[atoi(f[1])] = true
						progress()
					}
				case len(f) == 4 && f[0] == "paid":
					if !paid[atoi(f[1])] {
						paid[atoi(f[1])] = true
						progress()
					}
				}
				if stop != nil && stop() {
					return nil
				}
			case <-ctx.Done():
				return fmt.Errorf("shop: %w", ctx.Err())
			}
		}
	}

	// The first shop pays until the middle, then dies mid-payment.
	fmt.Fprintln(w, "Shop starts (process 1) ...")
	first, err := startShop(ctx, exe, rep.Journal, p.URL)
	if err != nil {
		return rep, err
	}
	if err := events(first, func() bool { return len(paid) >= killAfter }); err != nil {
		first.cmd.Process.Kill()
		first.cmd.Wait()
		return rep, err
	}
	p.hold.Store(true)
	select {
	case <-p.held:
		fmt.Fprintln(w, "  the provider has charged a card and holds the answer: the shop is killed (SIGKILL)")
	case <-time.After(10 * time.Second):
		fmt.Fprintln(w, "  (no payment reached the provider in 10s) the shop is killed (SIGKILL)")
	}
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return rep, err
	}
	if err := events(first, nil); err != nil { // what it said before it died
		return rep, err
	}
	werr := first.cmd.Wait()
	var exit *exec.ExitError
	if errors.As(werr, &exit) {
		ws, ok := exit.Sys().(syscall.WaitStatus)
		rep.Killed = ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
	}
	fmt.Fprintf(w, "  shop exited: %v, with %d orders paid as far as it said\n\n", werr, len(paid))
	p.hold.Store(false)
	close(p.release)

	fmt.Fprintln(w, "Shop restarts (process 2), resumes and pays the rest ...")
	second, err := startShop(ctx, exe, rep.Journal, p.URL)
	if err != nil {
		return rep, err
	}
	if err := events(second, nil); err != nil {
		second.cmd.Process.Kill()
		second.cmd.Wait()
		return rep, err
	}
	if err := second.cmd.Wait(); err != nil {
		return rep, fmt.Errorf("restarted shop: %w", err)
	}

	p.mu.Lock()
	charges := make([]int, orders)
	for n := 1; n <= orders; n++ {
		charges[n-1] = p.ledger[n]
	}
	p.mu.Unlock()
	l := chaoskit.Tally(p.Stats(), charges)
	rep.Attempts, rep.Faults, rep.Conflicts, rep.Replays = l.Requests, l.Faults, l.Conflicts, l.Replays
	rep.Paid, rep.Duplicates, rep.Lost = l.Paid, l.Duplicates, l.Lost
	rep.write(w)
	if rep.Duplicates != 0 || rep.Lost != 0 {
		return rep, fmt.Errorf("%d orders charged more than once, %d never charged", rep.Duplicates, rep.Lost)
	}
	return rep, nil
}

func (r Report) write(w io.Writer) {
	fmt.Fprintln(w, "\nReport")
	fmt.Fprintf(w, "  orders      %d, %d charged\n", r.Orders, r.Paid)
	retries, why := r.Conflicts, []string(nil)
	for _, f := range []struct {
		fault idemtest.Fault
		what  string
	}{
		{idemtest.DropAfter, "lost responses (charged, answer dropped)"},
		{idemtest.DropBefore, "connections dropped"},
		{idemtest.Unavailable, "× 503"},
		{idemtest.TooManyRequests, "× 429"},
		{idemtest.InProgress, "× 409 in progress"},
	} {
		retries += r.Faults[f.fault]
		why = append(why, fmt.Sprintf("%d %s", r.Faults[f.fault], f.what))
	}
	if r.Conflicts > 0 {
		why = append(why, fmt.Sprintf("%d × 409 while the key was being charged", r.Conflicts))
	}
	// Every request the provider got either failed (a fault or a real 409:
	// tried again with its key) or was answered: once per order, plus the
	// answers the crash kept from the shop (held at the kill, or received
	// but not yet marked in the journal), which Resume asked for again.
	answered := r.Attempts - retries
	sum := fmt.Sprintf("%d failed and tried again + %d answered", retries, answered)
	if extra := answered - r.Orders; extra > 0 {
		sum += fmt.Sprintf(" (%d orders, and %d answers the crash kept from the shop or from its journal, asked for again by Resume)", r.Orders, extra)
	}
	fmt.Fprintf(w, "  requests    %d (%.2f per order) = %s\n", r.Attempts, float64(r.Attempts)/float64(r.Orders), sum)
	fmt.Fprintf(w, "  retries     %d, after %s,\n              %s\n", retries, strings.Join(why[:2], ", "), strings.Join(why[2:], ", "))
	fmt.Fprintf(w, "  slow        %d answer(s) delayed, waited out (not failures)\n", r.Faults[idemtest.Delay])
	fmt.Fprintf(w, "  replays     %d (the provider answered a key it had already charged from its store)\n", r.Replays)
	fmt.Fprintf(w, "  crash       %s\n", map[bool]string{true: "the shop was SIGKILLed mid-payment and restarted", false: "the shop was not killed"}[r.Killed])
	fmt.Fprintf(w, "  resumed     %d (pending in the journal at the crash: in flight, or answered but not yet marked; finished by Resume with their original keys)\n", r.Resumed)
	fmt.Fprintf(w, "  duplicates  %d\n", r.Duplicates)
	fmt.Fprintf(w, "  lost        %d\n", r.Lost)
	fmt.Fprintf(w, "  journal     %s (kept for inspection; delete %s when done)\n", r.Journal, filepath.Dir(r.Journal))
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
