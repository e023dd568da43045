package pgstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemtest"
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
// pass times 30 s ahead and 30 s behind (pgstore.WithSkew): leases are
// judged by the database's clock. The final replica has a clean path.
//
// The default is small enough for CI. The long variant:
//
//	go test -run '^TestFleetChaos$' -v -fleet.ops=5000 -fleet.kills=30 -timeout=30m .
var (
	fleetOps     = flag.Int("fleet.ops", 90, "fleet chaos test: number of orders")
	fleetKills   = flag.Int("fleet.kills", 6, "fleet chaos test: SIGKILLs over all replicas")
	fleetWorkers = flag.Int("fleet.workers", 4, "fleet chaos test: payments in flight per replica")
	fleetSeed    = flag.Uint64("fleet.seed", 0, "fleet chaos test: seed of faults and kill points (0: random)")
	fleetDB      = flag.Bool("fleet.dbfaults", true, "fleet chaos test: faults between the replicas and PostgreSQL, and skewed replicas")
)

// Environment of a fleet child.
const (
	modeFleet        = "fleet"
	envFleetDSN      = "IDEM_FLEET_DSN"
	envFleetSchema   = "IDEM_FLEET_SCHEMA"
	envFleetURL      = "IDEM_FLEET_URL"
	envFleetOps      = "IDEM_FLEET_OPS"
	envFleetWorkers  = "IDEM_FLEET_WORKERS"
	envFleetReplica  = "IDEM_FLEET_REPLICA"  // 0, 1, 2: where in the order list the replica starts
	envFleetLifetime = "IDEM_FLEET_LIFETIME" // a time.Duration: the child exits on its own after it
	envFleetLocal    = "IDEM_FLEET_LOCAL"    // "1": a broken fleet, each replica with a journal of its own in memory
	envFleetSkew     = "IDEM_FLEET_SKEW"     // a time.Duration: the replica's times are that far off
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

// sendRT announces each attempt ("send <key>") before sending it.
type sendRT struct{ base http.RoundTripper }

func (s sendRT) RoundTrip(r *http.Request) (*http.Response, error) {
	crashtest.Emit("send", r.Header.Get("Idempotency-Key"))
	return s.base.RoundTrip(r)
}

// fleetChild is one life of one replica. It keeps no state outside the
// journal. Lines: "todo <n>" first, "send <key>" per attempt, "done
// <order>" per order it got a charge for, "resumed <name> <status>",
// "fatal <msg>" on a setup error and "complete" after a clean Close.
func fleetChild() int {
	lifetime, err := time.ParseDuration(os.Getenv(envFleetLifetime))
	if err != nil {
		lifetime = 3 * time.Minute
	}
	watchdog := time.AfterFunc(lifetime, func() {
		fmt.Fprintln(os.Stderr, "fleet child: out of time")
		os.Exit(4)
	})
	defer watchdog.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), lifetime)
	defer cancel()
	fatal := func(err error) int {
		crashtest.Emit("fatal", strings.ReplaceAll(err.Error(), "\n", " "))
		return 2
	}
	n, err := strconv.Atoi(os.Getenv(envFleetOps))
	if err != nil {
		return fatal(err)
	}
	workers, _ := strconv.Atoi(os.Getenv(envFleetWorkers))
	replicaIdx, _ := strconv.Atoi(os.Getenv(envFleetReplica))
	url := os.Getenv(envFleetURL)

	skew, _ := time.ParseDuration(os.Getenv(envFleetSkew))
	var store *pgstore.Store
	for try := 0; ; try++ { // the path to PostgreSQL may be faulty
		store, err = pgstore.Open(ctx, os.Getenv(envFleetDSN), pgstore.WithSchema(os.Getenv(envFleetSchema)), pgstore.WithSkew(skew))
		if err == nil {
			break
		}
		if try == 20 {
			return fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var journal idem.KeyStore = store
	local := os.Getenv(envFleetLocal) == "1"
	if local {
		defer store.Close()
		journal = idem.NewMemoryStore()
	}
	ops := pgx.Identifier{store.Schema(), "operations"}.Sanitize()
	succeeded := func(i int) (bool, error) {
		if local {
			return false, nil // it cannot know
		}
		var state int
		err := store.Pool().QueryRow(ctx, `SELECT state FROM `+ops+` WHERE name = $1`, fleetName(i)).Scan(&state)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return idem.State(state) == idem.StateSucceeded, err
	}
	todo := 0
	for i := range n {
		if done, err := succeeded(i); err != nil || !done { // an error (a faulty path) counts as to do
			todo++
		}
	}
	crashtest.Emit("todo", strconv.Itoa(todo))

	client := idem.New(journal,
		idem.WithOwner(fmt.Sprintf("replica-%d-pid-%d", replicaIdx, os.Getpid())),
		idem.WithLease(fleetLease),
		idem.WithBaseTransport(sendRT{&http.Transport{DisableKeepAlives: true}}), // no silent resends by net/http
		idem.WithRetryPolicy(idem.RetryPolicy{Initial: time.Millisecond, Max: 20 * time.Millisecond, RetryAfterCap: 10 * time.Millisecond}),
		idem.WithResumeConcurrency(max(workers, 1)))
	defer client.Close()

	// Finish what a dead replica left, where its lease lapsed.
	err = client.Resume(ctx, func(op idem.Operation, resp *http.Response, err error) {
		status := "error"
		if resp != nil {
			status = strconv.Itoa(resp.StatusCode)
			resp.Body.Close()
		}
		crashtest.Emit("resumed", op.Name, status)
	})
	if err != nil && !errors.Is(err, idem.ErrJournalWrite) && !errors.Is(err, idem.ErrOutcomeUnknown) && !errors.Is(err, context.DeadlineExceeded) {
		return fatal(err)
	}

	// Pay every order not yet paid, starting at this replica's share so
	// that the replicas overlap only part of the time.
	jobs := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	failed := 0
	for range max(workers, 1) {
		wg.Go(func() {
			for i := range jobs {
				if done, err := succeeded(i); err == nil && done {
					continue
				}
				if !fleetDrive(ctx, client.HTTPClient(), url, i) {
					mu.Lock()
					failed++
					mu.Unlock()
				}
			}
		})
	}
	start := replicaIdx * n / fleetReplicas
	for j := range n {
		jobs <- (start + j) % n
	}
	close(jobs)
	wg.Wait()
	if err := client.Close(); err != nil {
		if !errors.Is(err, idem.ErrJournalWrite) {
			return fatal(err)
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
// own, a bounded number of times, and reports whether it did.
func fleetDrive(ctx context.Context, hc *http.Client, url string, i int) bool {
	for try := range 20 {
		if try > 0 {
			select {
			case <-time.After(5 * time.Millisecond):
			case <-ctx.Done():
				return false
			}
		}
		octx, cancel := context.WithTimeout(idem.WithOperation(ctx, fleetName(i)), 30*time.Second)
		req, err := http.NewRequestWithContext(octx, http.MethodPost, url+fleetPath, strings.NewReader(fleetBody(i)))
		if err != nil {
			cancel()
			return false
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			cancel()
			continue // in doubt, in flight elsewhere, or the journal is away: the name keeps the key
		}
		var got struct{ Order string }
		derr := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&got)
		resp.Body.Close()
		cancel()
		if resp.StatusCode/100 == 2 && derr == nil && got.Order == fleetOrder(i) {
			crashtest.Emit("done", fleetOrder(i))
			return true
		}
	}
	return false
}

type fleetResult struct {
	ops, kills, children, resumed           int
	requests, runs, replays, conflicts      int
	duplicates, lost, foreignKeys, wrongKey int
	notSucceeded, pending                   int
	faults                                  map[idemtest.Fault]int
	elapsed                                 time.Duration
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
	seed := *fleetSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("fleet chaos seed %d (rerun with -fleet.seed=%d)", seed, seed)
	cfg := fleetConfig{ops: *fleetOps, kills: *fleetKills, workers: *fleetWorkers, seed: seed, dbFaults: *fleetDB}
	res := runFleet(t, cfg)
	assert.Zero(t, res.duplicates, "orders charged more than once")
	assert.Zero(t, res.lost, "orders never charged")
	assert.Zero(t, res.notSucceeded, "orders the journal does not record as succeeded")
	assert.Zero(t, res.pending, "operations left pending")
	assert.Zero(t, res.foreignKeys, "keys on the wire that the journal does not hold")
	assert.Zero(t, res.wrongKey, "orders not charged exactly once under their journaled key")
	assert.Equal(t, res.ops, res.runs, "charges")
	if cfg.kills > 0 {
		assert.Positive(t, res.kills, "no replica was ever killed")
	}
}

// TestFleetChaosCatchesLocalJournals checks that the fleet test's checks
// can fail: replicas that each keep their keys in a journal of their own
// give one order several keys, and charge it once per replica.
func TestFleetChaosCatchesLocalJournals(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("fleet chaos seed %d", seed)
	res := runFleet(t, fleetConfig{ops: 12, kills: 0, workers: 2, seed: seed, local: true})
	assert.Positive(t, res.duplicates, "replicas without a shared journal must charge some order twice")
	assert.Positive(t, res.foreignKeys, "replicas without a shared journal put keys on the wire that it does not hold")
}

type fleetConfig struct {
	ops, kills, workers int
	seed                uint64
	local               bool // each replica journals in memory, on its own
	dbFaults            bool // faults between replicas and PostgreSQL, skewed replicas
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

	srv := idemtest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct{ Order string }
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Order == "" {
			http.Error(w, "bad order", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%q}`, in.Order)
	}),
		idemtest.WithFaultRates(idemtest.FaultRates{
			Seed: seed, DropBefore: 0.05, DropAfter: 0.08, Delay: 0.04,
			Unavailable: 0.05, TooManyRequests: 0.04, InProgress: 0.03,
		}),
		idemtest.WithRetryAfter(time.Second), // capped at 10ms by the replicas
		idemtest.WithFaultDelay(2*time.Millisecond))
	defer srv.Close()

	lifetime := 3*time.Minute + time.Duration(cfg.ops)*20*time.Millisecond
	// Each replica slot reaches PostgreSQL through a proxy of its own,
	// faulty while the slot's replicas run.
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
	skews := []time.Duration{0, 30 * time.Second, -30 * time.Second}
	// env is a child's environment; a clean one reaches PostgreSQL
	// without faults and with its own clock.
	env := func(replica int, clean bool) []string {
		path := dsn
		if !clean {
			path = paths[replica]
		}
		e := []string{
			envFleetDSN + "=" + path, envFleetSchema + "=" + schema, envFleetURL + "=" + srv.URL,
			envFleetOps + "=" + strconv.Itoa(cfg.ops), envFleetWorkers + "=" + strconv.Itoa(cfg.workers),
			envFleetReplica + "=" + strconv.Itoa(replica), envFleetLifetime + "=" + lifetime.String(),
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
	res := fleetResult{ops: cfg.ops}
	scan := func(lines []string) bool {
		mu.Lock()
		defer mu.Unlock()
		res.children++
		complete := false
		for _, l := range lines {
			verb, rest, _ := strings.Cut(l, " ")
			switch verb {
			case "resumed":
				res.resumed++
			case "complete":
				complete = true
			case "fatal":
				t.Errorf("fleet child: %s", rest)
			}
		}
		return complete
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
				first, ok := child.Next()
				if !ok {
					t.Errorf("replica %d ended before saying anything", r)
					return
				}
				todo, err := strconv.Atoi(strings.TrimPrefix(first, "todo "))
				if err != nil {
					t.Errorf("replica %d: first line %q", r, first)
					return
				}
				// A replica writes about two lines per order it pays, and
				// shares the orders with two others.
				lines := child.KillAfter(1 + rng.IntN(max(1, todo/(kills-k+1))))
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

	st := srv.Stats()
	res.requests, res.runs, res.replays, res.conflicts, res.faults = st.Requests, st.Runs, st.Replays, st.Conflicts, st.Faults
	for i := range cfg.ops {
		switch runs := st.RunsByPayload[idemtest.Fingerprint(http.MethodPost, fleetPath, []byte(fleetBody(i)))]; {
		case runs == 0:
			res.lost++
		case runs > 1:
			res.duplicates++
		}
	}
	res.duplicates = max(res.duplicates, st.DuplicateKeys())
	pend, err := store.Pending(ctx, "", 0)
	require.NoError(t, err)
	res.pending = len(pend)
	journaled := make(map[string]bool, cfg.ops)
	for i := range cfg.ops {
		var key string
		var state int
		err := store.Pool().QueryRow(ctx, `SELECT key, state FROM `+pgx.Identifier{schema, "operations"}.Sanitize()+` WHERE name = $1`, fleetName(i)).Scan(&key, &state)
		if errors.Is(err, pgx.ErrNoRows) {
			res.notSucceeded++
			continue
		}
		require.NoError(t, err)
		journaled[key] = true
		if idem.State(state) != idem.StateSucceeded {
			res.notSucceeded++
		}
		if st.RunsByKey[key] != 1 {
			res.wrongKey++
		}
	}
	for k := range st.AttemptsByKey {
		if !journaled[k] {
			res.foreignKeys++
		}
	}
	if cfg.dbFaults {
		t.Logf("fleet chaos seed %d: database path faults %v (stalls, cuts, refusals, swallowed answers), replicas' times off by %v", seed, dbFaults, skews)
	}
	t.Logf("fleet chaos seed %d: %d orders, %d replicas, %d SIGKILLs over %d replica processes, %d operations resumed; "+
		"%d requests (%.2f per order), %d charges, %d replays, %d conflicts, faults %v; "+
		"%d duplicated, %d lost, %d not succeeded, %d left pending, %d keys not in the journal, %d orders not charged once under their key; elapsed %v",
		seed, res.ops, fleetReplicas, res.kills, res.children, res.resumed,
		res.requests, float64(res.requests)/float64(max(res.ops, 1)), res.runs, res.replays, res.conflicts, res.faults,
		res.duplicates, res.lost, res.notSucceeded, res.pending, res.foreignKeys, res.wrongKey, res.elapsed.Round(time.Millisecond))
	return res
}
