package pgstore_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemtest"
	"github.com/idemgo/idem/internal/chaoskit"
	"github.com/idemgo/idem/internal/crashtest"
	"github.com/idemgo/idem/pgstore"
	"github.com/idemgo/idem/pgstore/internal/pgtest"
)

// The fleet chaos test: three replicas, each a real child process, pay the
// same orders (the same operation names) through one PostgreSQL journal,
// against a provider (idemtest, in this process) that faults about a third
// of the attempts. Replicas are SIGKILLed at random moments and restarted;
// when every replica has used up its kills and finished, a final replica
// resumes and re-drives whatever is left. Then every order must have been
// charged exactly once, under the one key the journal holds for its name,
// with no key on the wire that the journal does not hold and nothing left
// pending.
//
// Between each replica and PostgreSQL sits a proxy of the test's own that
// stalls, cuts, refuses and swallows the answer to a reservation after
// PostgreSQL committed it (-fleet.dbfaults), and two of the three replicas
// pass times 30 s ahead and 30 s behind (skewedStore): leases are
// judged by the database's clock. The final replica has a clean path.
//
// Replicas are also paused (-fleet.pauses): SIGSTOPped for longer than
// their lease (1.2 to 2.5 s of a 1 s lease: a GC pause, a VM migration, a
// throttled cgroup) and SIGCONTed, beside the kills and the proxy's
// faults, so that a paused replica's operations are taken over while it
// sleeps and it wakes up to fenced marks and lost leases. Every call has a
// deadline (-fleet.deadline); each replica reports the calls that
// returned after theirs, and none that overlapped no pause of its own
// process (a process that is stopped returns nothing on time) may return
// later than its deadline plus the documented grace of 1 s.
//
// The default is small enough for CI. The long variant:
//
//	go test -run '^TestFleetChaos$' -v -fleet.ops=8000 -fleet.kills=45 -timeout=40m .
var (
	fleetFlags    = chaoskit.NewFlags("fleet", "fleet chaos test", 90, 6, 4)
	fleetDB       = flag.Bool("fleet.dbfaults", true, "fleet chaos test: faults between the replicas and PostgreSQL, and skewed replicas")
	fleetPauses   = flag.Bool("fleet.pauses", true, "fleet chaos test: replicas SIGSTOPped for longer than their lease, then SIGCONTed")
	fleetDeadline = flag.Duration("fleet.deadline", 3*time.Second, "fleet chaos test: the deadline of each call a replica makes")
)

// Environment of a fleet child, beside chaoskit.Env.
const (
	modeFleet        = "fleet"
	envFleetDSN      = "IDEM_FLEET_DSN"
	envFleetSchema   = "IDEM_FLEET_SCHEMA"
	envFleetReplica  = "IDEM_FLEET_REPLICA"  // 0, 1, 2: where in the order list the replica starts
	envFleetLifetime = "IDEM_FLEET_LIFETIME" // a time.Duration: the child exits on its own after it
	envFleetLocal    = "IDEM_FLEET_LOCAL"    // "1": a broken fleet, each replica with a journal of its own in memory
	envFleetSkew     = "IDEM_FLEET_SKEW"     // a time.Duration: the replica's times are that far off
	envFleetDeadline = "IDEM_FLEET_DEADLINE" // a time.Duration: each call's deadline
	envFleetPausable = "IDEM_FLEET_PAUSABLE" // "1": the test may SIGSTOP this replica
	// fleetLease is the replicas' lease: a killed replica's operations wait
	// that long before another replica may send them.
	fleetLease    = time.Second
	fleetReplicas = 3
	fleetPath     = "/v1/charges"
)

func fleetOrder(i int) string { return "order-" + strconv.Itoa(i) }
func fleetName(i int) string  { return "pay:" + fleetOrder(i) }
func fleetBody(i int) string {
	return fmt.Sprintf(`{"order":%q,"amount":%d}`, fleetOrder(i), 1000+i)
}

// fleetLookup finds a named operation's key and state in the journal of
// store, by SQL (pgstore has no lookup by name of its own).
func fleetLookup(store *pgstore.Store) chaoskit.Lookup {
	ops := pgx.Identifier{store.Schema(), "operations"}.Sanitize()
	return func(ctx context.Context, name string) (idem.Operation, error) {
		var key string
		var state int
		err := store.Pool().QueryRow(ctx, `SELECT key, state FROM `+ops+` WHERE name = $1`, name).Scan(&key, &state)
		if errors.Is(err, pgx.ErrNoRows) {
			return idem.Operation{}, idem.ErrNotFound
		}
		return idem.Operation{Name: name, Key: key, State: idem.State(state)}, err
	}
}

// fleetChild is one life of one replica. It keeps no state outside the
// journal. Its lines are chaoskit's, with "done <order>" per order it got
// a charge for.
func fleetChild() int {
	lifetime, err := time.ParseDuration(os.Getenv(envFleetLifetime))
	if err != nil {
		lifetime = 3 * time.Minute
	}
	ctx, stop := chaoskit.Life("fleet child", lifetime)
	defer stop()
	env, err := chaoskit.ReadEnv()
	if err != nil {
		return chaoskit.Fatal(err)
	}
	n := env.Ops
	replicaIdx, _ := strconv.Atoi(os.Getenv(envFleetReplica))

	skew, _ := time.ParseDuration(os.Getenv(envFleetSkew))
	var store *pgstore.Store
	for try := 0; ; try++ { // the path to PostgreSQL may be faulty
		store, err = pgstore.Open(ctx, os.Getenv(envFleetDSN), pgstore.WithSchema(os.Getenv(envFleetSchema)))
		if err == nil {
			break
		}
		if try == 20 {
			return chaoskit.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var journal idem.KeyStore = store
	if skew != 0 {
		journal = &skewedStore{Store: store, d: skew}
	}
	local := os.Getenv(envFleetLocal) == "1"
	if local {
		defer store.Close()
		journal = idem.NewMemoryStore()
	}
	lookup := fleetLookup(store)
	succeeded := func(i int) (bool, error) {
		if local {
			return false, nil // it cannot know
		}
		return chaoskit.Succeeded(ctx, lookup, fleetName(i))
	}
	todo := 0
	for i := range n {
		if done, err := succeeded(i); err != nil || !done { // an error (a faulty path) counts as to do
			todo++
		}
	}
	crashtest.Emit("todo", strconv.Itoa(todo))

	client := idem.New(journal, append([]idem.Option{
		idem.WithOwner(fmt.Sprintf("replica-%d-pid-%d", replicaIdx, os.Getpid())),
		idem.WithLease(fleetLease),
	}, chaoskit.ClientOptions(nil, env.Workers)...)...)
	defer client.Close()

	// Finish what a dead replica left, where its lease lapsed.
	err = client.Resume(ctx, func(op idem.Operation, resp *http.Response, err error) {
		if resp != nil {
			resp.Body.Close()
		}
		crashtest.Emit("resumed", op.Name, chaoskit.Status(resp))
	})
	if err != nil && !errors.Is(err, idem.ErrJournalWrite) && !errors.Is(err, idem.ErrOutcomeUnknown) && !errors.Is(err, context.DeadlineExceeded) {
		return chaoskit.Fatal(err)
	}

	// Pay every order not yet paid, starting at this replica's share so
	// that the replicas overlap only part of the time.
	start := replicaIdx * n / fleetReplicas
	jobs := func(yield func(int) bool) {
		for j := range n {
			if !yield((start + j) % n) {
				return
			}
		}
	}
	deadline, err := time.ParseDuration(os.Getenv(envFleetDeadline))
	if err != nil {
		deadline = 30 * time.Second
	}
	failed := chaoskit.Pool(env.Workers, jobs, func(i int) bool {
		if done, err := succeeded(i); err == nil && done {
			return true
		}
		return fleetDrive(ctx, client.HTTPClient(), env.URL, i, deadline)
	})
	if err := client.Close(); err != nil {
		if !errors.Is(err, idem.ErrJournalWrite) {
			return chaoskit.Fatal(err)
		}
		return 1 // marks not written: the operations stay pending for the next replica
	}
	if failed > 0 {
		return 1
	}
	crashtest.Emit("complete")
	return 0
}

// fleetDrive pays order i by name until it gets a 2xx answer that is its
// own, a bounded number of times, and reports whether it did. Each call
// has the given deadline; one that returns after it is reported in a line
// "late <pid> <start> <deadline> <end>" (Unix nanoseconds).
func fleetDrive(ctx context.Context, hc *http.Client, url string, i int, deadline time.Duration) bool {
	return chaoskit.Try(ctx, 20, 5*time.Millisecond, func(int) (bool, error) {
		start := time.Now()
		due := start.Add(deadline)
		octx, cancel := context.WithDeadline(idem.WithOperation(ctx, fleetName(i)), due)
		defer cancel()
		req, err := chaoskit.Post(octx, url+fleetPath, fleetBody(i))
		if err != nil {
			return false, err
		}
		resp, err := hc.Do(req)
		ok := err == nil && chaoskit.Answer(resp, fleetOrder(i))
		if end := time.Now(); end.After(due) {
			crashtest.Emit("late", strconv.Itoa(os.Getpid()), strconv.FormatInt(start.UnixNano(), 10),
				strconv.FormatInt(due.UnixNano(), 10), strconv.FormatInt(end.UnixNano(), 10))
		}
		if !ok {
			return false, nil // in doubt, in flight elsewhere, or the journal is away: the name keeps the key
		}
		crashtest.Emit("done", fleetOrder(i))
		return true, nil
	})
}

// pauseWindow is a time a replica process was stopped.
type pauseWindow struct {
	pid        int
	start, end int64 // Unix nanoseconds
}

// fleetChildOf returns the pid of the running child of this process that
// is fleet replica slot replica and may be paused, or 0. It reads /proc,
// so that the test finds the replica of the moment without reading its
// lines.
func fleetChildOf(replica int) int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	self := os.Getpid()
	want := envFleetReplica + "=" + strconv.Itoa(replica)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read after the last ')'.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) < 2 || fields[1] != strconv.Itoa(self) {
			continue
		}
		environ, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil {
			continue
		}
		vars := strings.Split(string(environ), "\x00")
		if slices.Contains(vars, want) && slices.Contains(vars, envFleetPausable+"=1") {
			return pid
		}
	}
	return 0
}

// fleetPause stops replica slot replica's process now and then until
// stop, each time for longer than the lease, and records when.
func fleetPause(replica int, rng *rand.Rand, stop <-chan struct{}, mu *sync.Mutex, windows *[]pauseWindow) {
	wait := func(d time.Duration) bool {
		select {
		case <-stop:
			return false
		case <-time.After(d):
			return true
		}
	}
	// The first pause comes early, so that a short run has one too; while
	// the slot has no child (between a kill and the next start), it looks
	// again soon.
	next := time.Duration(200+rng.IntN(500)) * time.Millisecond
	for wait(next) {
		next = 20 * time.Millisecond
		pid := fleetChildOf(replica)
		if pid == 0 {
			continue
		}
		start := time.Now()
		if syscall.Kill(pid, syscall.SIGSTOP) != nil {
			continue // it just ended
		}
		next = time.Duration(500+rng.IntN(2500)) * time.Millisecond
		wait(fleetLease + time.Duration(200+rng.IntN(1300))*time.Millisecond)
		_ = syscall.Kill(pid, syscall.SIGCONT)
		mu.Lock()
		*windows = append(*windows, pauseWindow{pid: pid, start: start.UnixNano(), end: time.Now().UnixNano()})
		mu.Unlock()
	}
}

// overruns returns, from the "late" lines of the replicas, the largest
// overrun of a deadline by a call that overlapped no pause of its own
// process, and how many late calls did overlap one.
func overruns(late [][4]int64, windows []pauseWindow) (worst time.Duration, n, paused int) {
	for _, l := range late {
		pid, start, due, end := int(l[0]), l[1], l[2], l[3]
		overlaps := false
		for _, w := range windows {
			if w.pid == pid && w.start < end && w.end > start {
				overlaps = true
			}
		}
		if overlaps {
			paused++
			continue
		}
		n++
		worst = max(worst, time.Duration(end-due))
	}
	return worst, n, paused
}

// fleetResult is what a fleet run found: the ledger, and the lives of the
// replicas.
type fleetResult struct {
	*chaoskit.Ledger
	kills, children, resumed int
	elapsed                  time.Duration
	pauses                   int
	late                     [][4]int64 // the replicas' late calls: pid, start, deadline, end
	windows                  []pauseWindow
}

// fleetDBFaults breaks p now and then until stop: it stalls it, cuts its
// connections, refuses them for a moment, or lets the next reservation's
// statement through and swallows its answer (then cuts that connection,
// so that its replica learns of it).
func fleetDBFaults(p *proxy, rng *rand.Rand, stop <-chan struct{}, mu *sync.Mutex, counts *[4]int) {
	pause := func(d time.Duration) bool {
		select {
		case <-stop:
			return false
		case <-time.After(d):
			return true
		}
	}
	for pause(time.Duration(100+rng.IntN(400)) * time.Millisecond) {
		kind := rng.IntN(4)
		mu.Lock()
		counts[kind]++
		mu.Unlock()
		switch kind {
		case 0:
			p.Stall()
			pause(time.Duration(200+rng.IntN(800)) * time.Millisecond)
			p.Flow()
		case 1:
			p.Cut()
		case 2:
			p.Down()
			pause(time.Duration(100+rng.IntN(200)) * time.Millisecond)
			p.Up()
		case 3:
			p.SwallowAfter("pay:order-")
			pause(300 * time.Millisecond)
			p.Cut()
		}
	}
	p.Flow()
	p.Up()
}

func TestFleetChaos(t *testing.T) {
	seed := fleetFlags.Seed(t)
	cfg := fleetConfig{ops: *fleetFlags.Ops, kills: *fleetFlags.Kills, workers: *fleetFlags.Workers, seed: seed, dbFaults: *fleetDB,
		pauses: *fleetPauses, deadline: *fleetDeadline}
	res := runFleet(t, cfg)
	res.Assert(t)
	if cfg.kills > 0 {
		assert.Positive(t, res.kills, "no replica was ever killed")
	}
	if cfg.pauses {
		assert.Positive(t, res.pauses, "no replica was ever paused")
	}
	// No call returns later than its deadline plus the in-doubt path's
	// documented grace (README: the caller's deadline + 1 s), unless its
	// own process was stopped meanwhile.
	worst, n, paused := overruns(res.late, res.windows)
	t.Logf("fleet chaos seed %d: calls with a %v deadline that returned late: %d not paused (worst overrun %v), %d that overlapped a pause of their replica",
		seed, cfg.deadline, n, worst.Round(time.Millisecond), paused)
	assert.LessOrEqual(t, worst, inDoubtGrace, "a call returned later than its deadline plus the documented grace")
}

// inDoubtGrace is the grace past its caller's deadline that idem documents
// for the in-doubt path (README, "When a dependency is slow or stuck").
const inDoubtGrace = time.Second

// TestFleetChaosCatchesLocalJournals checks that the fleet test's checks
// can fail: replicas that each keep their keys in a journal of their own
// give one order several keys, and charge it once per replica.
func TestFleetChaosCatchesLocalJournals(t *testing.T) {
	seed := fleetFlags.Seed(t)
	res := runFleet(t, fleetConfig{ops: 12, kills: 0, workers: 2, seed: seed, local: true})
	assert.Positive(t, res.Duplicates, "replicas without a shared journal must charge some order twice")
	assert.Positive(t, res.ForeignKeys, "replicas without a shared journal put keys on the wire that it does not hold")
}

type fleetConfig struct {
	ops, kills, workers int
	seed                uint64
	local               bool // each replica journals in memory, on its own
	dbFaults            bool // faults between replicas and PostgreSQL, skewed replicas
	pauses              bool // replicas SIGSTOPped past their lease, then SIGCONTed
	deadline            time.Duration
}

// runFleet runs the fleet scenario and returns what it found; it fails t
// only when the scenario itself cannot run.
func runFleet(t *testing.T, cfg fleetConfig) fleetResult {
	t.Helper()
	dsn := pgtest.DSN(t)
	seed := cfg.seed
	start := time.Now()
	schema := pgtest.Schema(t, dsn)
	ctx := testContext(t)
	// The parent's own view of the journal, for the checks.
	store, err := pgstore.Open(ctx, dsn, pgstore.WithSchema(schema))
	require.NoError(t, err)
	defer store.Close()

	srv := chaoskit.Provider(idemtest.FaultRates{ // Retry-After capped at 10ms by the replicas
		Seed: seed, DropBefore: 0.05, DropAfter: 0.08, Delay: 0.04,
		Unavailable: 0.05, TooManyRequests: 0.04, InProgress: 0.03,
	})
	defer srv.Close()

	lifetime := 3*time.Minute + time.Duration(cfg.ops)*20*time.Millisecond
	// Each replica slot reaches PostgreSQL through a proxy of its own,
	// faulty while the slot's replicas run.
	var res fleetResult
	var mu sync.Mutex
	paths := make([]string, fleetReplicas)
	stopFaults := make(chan struct{})
	var faultsWG sync.WaitGroup
	var dbFaults [4]int // stalls, cuts, refusals, swallowed answers
	for r := range fleetReplicas {
		paths[r] = dsn
		if !cfg.dbFaults {
			continue
		}
		p, through := newProxy(t, dsn)
		paths[r] = through
		rng := rand.New(rand.NewPCG(seed, uint64(100+r)))
		faultsWG.Go(func() { fleetDBFaults(p, rng, stopFaults, &mu, &dbFaults) })
	}
	if cfg.pauses {
		for r := range fleetReplicas {
			rng := rand.New(rand.NewPCG(seed, uint64(200+r)))
			faultsWG.Go(func() { fleetPause(r, rng, stopFaults, &mu, &res.windows) })
		}
	}
	skews := []time.Duration{0, 30 * time.Second, -30 * time.Second}
	// env is a child's environment; a clean one reaches PostgreSQL
	// without faults and with its own clock.
	env := func(replica int, clean bool) []string {
		path := dsn
		if !clean {
			path = paths[replica]
		}
		e := append(chaoskit.Env{URL: srv.URL, Ops: cfg.ops, Workers: cfg.workers}.Vars(),
			envFleetDSN+"="+path, envFleetSchema+"="+schema,
			envFleetReplica+"="+strconv.Itoa(replica), envFleetLifetime+"="+lifetime.String())
		if cfg.deadline > 0 {
			e = append(e, envFleetDeadline+"="+cfg.deadline.String())
		}
		if cfg.pauses && !clean {
			e = append(e, envFleetPausable+"=1")
		}
		if cfg.local {
			e = append(e, envFleetLocal+"=1")
		}
		if cfg.dbFaults && !clean {
			e = append(e, envFleetSkew+"="+skews[replica].String())
		}
		return e
	}
	// scan counts a child's lines; it reports whether the child completed.
	scan := func(lines []string) bool {
		said := chaoskit.Scan(lines)
		for _, msg := range said.Fatal {
			t.Errorf("fleet child: %s", msg)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, line := range lines {
			if rest, ok := strings.CutPrefix(line, "late "); ok {
				var l [4]int64
				if _, err := fmt.Sscan(rest, &l[0], &l[1], &l[2], &l[3]); err == nil {
					res.late = append(res.late, l)
				}
			}
		}
		res.children++
		res.resumed += said.Resumed
		return said.Complete
	}

	// Each replica slot: its share of the kills, then a life to the end.
	var wg sync.WaitGroup
	for r := range fleetReplicas {
		kills := cfg.kills / fleetReplicas
		if r < cfg.kills%fleetReplicas {
			kills++
		}
		rng := rand.New(rand.NewPCG(seed, uint64(r)))
		wg.Go(func() {
			for k := 0; k < kills; k++ {
				child := crashtest.Start(t, modeFleet, env(r, false)...)
				// A replica writes about two lines per order it pays, and
				// shares the orders with two others.
				lines, err := chaoskit.KillLife(child, rng, 1, kills-k)
				if err != nil {
					t.Errorf("replica %d: %v", r, err)
					return
				}
				if !scan(lines) {
					mu.Lock()
					res.kills++
					mu.Unlock()
				}
			}
			child := crashtest.Start(t, modeFleet, env(r, false)...)
			lines, err := child.Wait()
			if !scan(lines) {
				t.Logf("replica %d did not complete: %v", r, err)
			}
		})
	}
	wg.Wait()
	close(stopFaults)
	faultsWG.Wait()
	// The last replica standing finishes what is left, on a clean path.
	final := crashtest.Start(t, modeFleet, env(0, true)...)
	lines, err := final.Wait()
	require.NoError(t, err, "final replica")
	require.True(t, scan(lines), "the final replica completed")
	res.elapsed = time.Since(start)
	// The checks get a bound of their own: a long run outlasts the
	// context the run began with.
	ctx = testContext(t)

	st := srv.Stats()
	res.Ledger = chaoskit.Tally(st, chaoskit.PostCharges(st, cfg.ops, fleetPath, fleetBody))
	pend, err := store.Pending(ctx, "", 0)
	require.NoError(t, err)
	res.Pending = len(pend)
	require.NoError(t, res.Named(ctx, fleetLookup(store), chaoskit.Names(cfg.ops, fleetName)))
	res.Foreign(nil)
	res.pauses = len(res.windows)
	if cfg.pauses {
		var stopped time.Duration
		for _, w := range res.windows {
			stopped += time.Duration(w.end - w.start)
		}
		t.Logf("fleet chaos seed %d: %d SIGSTOP/SIGCONT pauses of replicas (%v stopped in all, each longer than the %v lease)",
			seed, res.pauses, stopped.Round(time.Millisecond), fleetLease)
	}
	if cfg.dbFaults {
		t.Logf("fleet chaos seed %d: database path faults %v (stalls, cuts, refusals, swallowed answers), replicas' times off by %v", seed, dbFaults, skews)
	}
	t.Logf("fleet chaos seed %d: %v; %d replicas, %d SIGKILLs over %d replica processes, %d operations resumed; elapsed %v",
		seed, res.Ledger, fleetReplicas, res.kills, res.children, res.resumed, res.elapsed.Round(time.Millisecond))
	return res
}
