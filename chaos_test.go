package idem_test

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
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemtest"
	"github.com/idemgo/idem/internal/crashtest"
)

// The chaos test drives many named operations through an idemtest server
// (in this, the parent, process) that faults about a third of the attempts,
// from a client in a child process that is SIGKILLed at random moments and
// restarted. Each child opens the journal, learns from it which operations
// are already done, resumes the pending ones, and re-drives the rest by
// name. At the end every operation must have been performed exactly once
// under its journaled key, none lost, and nothing left pending.
//
// The default configuration is short enough for CI. The long one:
//
//	go test -run '^TestChaos$' -v -chaos.ops=10000 -chaos.kills=50 .
//
// Faults are drawn from the seed and each request's key; keys are random
// UUIDs (as idem promises), so a seed reproduces the kill points and the
// fault rates, not the exact fault of every request.
var (
	chaosOps     = flag.Int("chaos.ops", 200, "chaos test: number of operations")
	chaosKills   = flag.Int("chaos.kills", 4, "chaos test: number of times the client process is SIGKILLed")
	chaosWorkers = flag.Int("chaos.workers", 8, "chaos test: operations in flight at once in the client")
	chaosSeed    = flag.Uint64("chaos.seed", 0, "chaos test: seed of faults and kill points (0: random)")
	chaosUnnamed = flag.Int("chaos.unnamed", 50, "chaos test: operations of a caller that retries on its own, without a name")
)

func init() { crashChildren["chaos"] = childChaos }

// Environment of a chaos child.
const (
	envChaosJournal = "IDEM_CHAOS_JOURNAL"
	envChaosURL     = "IDEM_CHAOS_URL"
	envChaosOps     = "IDEM_CHAOS_OPS"
	envChaosWorkers = "IDEM_CHAOS_WORKERS"
	envChaosRotate  = "IDEM_CHAOS_ROTATE"  // "1": simulate a client that rotates keys on retry
	envChaosUnnamed = "IDEM_CHAOS_UNNAMED" // operations an outer retry loop drives without a name
	envChaosFinal   = "IDEM_CHAOS_FINAL"   // "1": the child is not killed, and drives the unnamed operations
)

// chaosChildLimit bounds the life of one chaos child; past it the child
// exits on its own, so no wait of the parent can hang.
const chaosChildLimit = 3 * time.Minute

// chaosName and chaosBody are operation i's name and its distinct payload.
func chaosName(i int) string { return "order-" + strconv.Itoa(i) }

func chaosBody(i int) string {
	return fmt.Sprintf(`{"order":%q,"amount":%d}`, chaosName(i), 1000+i)
}

const chaosPath = "/v1/orders"

// chaosRT announces each attempt to the parent ("send <key>") before
// sending it. With rotate set it plays a broken client: every attempt after
// the first one of a key, in this process, goes out under a fresh key.
type chaosRT struct {
	base   http.RoundTripper
	rotate bool
	mu     sync.Mutex
	seen   map[string]int
}

func (c *chaosRT) RoundTrip(r *http.Request) (*http.Response, error) {
	key := r.Header.Get("Idempotency-Key")
	if c.rotate {
		c.mu.Lock()
		c.seen[key]++
		n := c.seen[key]
		c.mu.Unlock()
		if n > 1 {
			r = r.Clone(r.Context())
			r.Header.Set("Idempotency-Key", uuid.NewString())
		}
	}
	crashtest.Emit("send", key)
	return c.base.RoundTrip(r)
}

// childChaos is one life of the chaos client. It keeps no state outside the
// journal: what is done is what the journal records as succeeded.
//
// Lines: "todo <n>" first, then "send <key>" per attempt, "resumed <name>
// <status>" per resumed operation, "done <name> <status>" per re-driven
// one, "gaveup <name>" for an operation still failing after its tries,
// "fatal <msg>" on a setup error, and "complete" after a clean Close.
func childChaos() int {
	watchdog := time.AfterFunc(chaosChildLimit, func() {
		fmt.Fprintln(os.Stderr, "chaos child: out of time")
		os.Exit(4)
	})
	defer watchdog.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), chaosChildLimit)
	defer cancel()
	fatal := func(err error) int {
		crashtest.Emit("fatal", strings.ReplaceAll(err.Error(), "\n", " "))
		return 2
	}

	journal, url := os.Getenv(envChaosJournal), os.Getenv(envChaosURL)
	n, err := strconv.Atoi(os.Getenv(envChaosOps))
	if err != nil {
		return fatal(err)
	}
	workers, err := strconv.Atoi(os.Getenv(envChaosWorkers))
	if err != nil || workers < 1 {
		workers = 1
	}

	// What is done, according to the journal.
	done := make([]bool, n)
	store, err := idem.OpenBoltStore(journal, &idem.BoltOptions{LockTimeout: 10 * time.Second})
	if err != nil {
		return fatal(err)
	}
	todo := 0
	for i := range n {
		op, err := store.Named(ctx, chaosName(i))
		switch {
		case err == nil:
			done[i] = op.State == idem.StateSucceeded
		case !errors.Is(err, idem.ErrNotFound):
			store.Close()
			return fatal(err)
		}
		if !done[i] {
			todo++
		}
	}
	if err := store.Close(); err != nil {
		return fatal(err)
	}
	crashtest.Emit("todo", strconv.Itoa(todo))

	rt := &chaosRT{
		base:   &http.Transport{DisableKeepAlives: true}, // no silent resends by net/http
		rotate: os.Getenv(envChaosRotate) == "1",
		seen:   make(map[string]int),
	}
	store, err = idem.OpenBoltStore(journal, &idem.BoltOptions{LockTimeout: 10 * time.Second})
	if err != nil {
		return fatal(err)
	}
	client := idem.New(store,
		idem.WithBaseTransport(rt),
		idem.WithRetryPolicy(idem.RetryPolicy{Initial: time.Millisecond, Max: 20 * time.Millisecond, RetryAfterCap: 10 * time.Millisecond}),
		idem.WithResumeConcurrency(workers))
	defer client.Close()

	// Resume what a crash interrupted.
	index := make(map[string]int, n)
	for i := range n {
		index[chaosName(i)] = i
	}
	var mu sync.Mutex
	err = client.Resume(ctx, func(op idem.Operation, resp *http.Response, err error) {
		status := "error"
		if resp != nil {
			ok := chaosAnswerOK(resp, op.Name)
			status = strconv.Itoa(resp.StatusCode)
			if i, named := index[op.Name]; named && ok {
				mu.Lock()
				done[i] = true
				mu.Unlock()
			}
		}
		crashtest.Emit("resumed", op.Name, status)
	})
	if err != nil {
		return fatal(err)
	}

	// Re-drive the rest by name.
	unnamed, _ := strconv.Atoi(os.Getenv(envChaosUnnamed))
	if os.Getenv(envChaosFinal) != "1" {
		unnamed = 0 // a caller without a name has nothing durable to re-drive by after a crash
	}
	jobs := make(chan int)
	failed := 0
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range jobs {
				if !chaosDrive(ctx, client.HTTPClient(), url, i, i < n) {
					crashtest.Emit("gaveup", chaosName(i))
					mu.Lock()
					failed++
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		mu.Lock()
		skip := done[i]
		mu.Unlock()
		if !skip {
			jobs <- i
		}
	}
	for i := n; i < n+unnamed; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	if err := client.Close(); err != nil {
		return fatal(err)
	}
	if failed > 0 {
		return 1
	}
	crashtest.Emit("complete")
	return 0
}

// chaosDrive sends operation i until it gets a 2xx answer that is its own,
// trying a bounded number of times, and reports whether it did. By name,
// between tries it only sleeps: the name carries the key. Without a name
// it plays a caller that retries on its own, as an SDK's retry loop does:
// each try is a fresh request with the same payload and no key, and idem
// must take every try after a failure for a resend of the same operation.
func chaosDrive(ctx context.Context, hc *http.Client, url string, i int, named bool) bool {
	name := chaosName(i)
	for try := range 10 {
		if try > 0 {
			select {
			case <-time.After(5 * time.Millisecond):
			case <-ctx.Done():
				return false
			}
		}
		octx := ctx
		if named {
			octx = idem.WithOperation(ctx, name)
		}
		octx, cancel := context.WithTimeout(octx, 30*time.Second)
		req, err := http.NewRequestWithContext(octx, http.MethodPost, url+chaosPath, strings.NewReader(chaosBody(i)))
		if err != nil {
			cancel()
			return false
		}
		req.Header.Set("Content-Type", "application/json")
		if !named {
			req.Header.Set("X-Retry-Count", strconv.Itoa(try)) // volatile, as an SDK's
		}
		resp, err := hc.Do(req)
		if err != nil {
			cancel()
			continue // in doubt: the same name, or the same payload, is the same key
		}
		ok := chaosAnswerOK(resp, name)
		cancel()
		if ok {
			crashtest.Emit("done", name, strconv.Itoa(resp.StatusCode))
			return true
		}
	}
	return false
}

// chaosAnswerOK reads and closes resp and reports whether it is a 2xx
// answer for the operation name.
func chaosAnswerOK(resp *http.Response, name string) bool {
	defer resp.Body.Close()
	var got struct{ Order string }
	err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&got)
	return resp.StatusCode/100 == 2 && err == nil && got.Order == name
}

// chaosConfig is one run of the chaos test.
type chaosConfig struct {
	ops, kills, workers int
	unnamed             int // operations a caller without a name drives in the last child
	seed                uint64
	rates               idemtest.FaultRates
	rotate              bool // the child plays a client that rotates keys
}

// chaosResult is what a chaos run found.
type chaosResult struct {
	ops, attempts, replays, conflicts int
	faults                            map[idemtest.Fault]int
	performed                         int // handler runs
	duplicates                        int // operations performed more than once
	lost                              int // operations never performed
	foreignKeys                       int // keys the server saw that the journal does not hold
	wrongKey                          int // operations not performed under their journaled key
	notSucceeded                      int // operations the journal does not record as succeeded
	pending                           int // operations left pending in the journal
	kills, children, resumed, gaveUp  int
	complete                          bool
	elapsed                           time.Duration
}

// chaosFaults is about a third of attempts faulty, of every kind.
func chaosFaults(seed uint64) idemtest.FaultRates {
	return idemtest.FaultRates{
		Seed:            seed,
		DropBefore:      0.06,
		DropAfter:       0.08, // performed, response lost
		Delay:           0.04,
		Unavailable:     0.06,
		TooManyRequests: 0.05,
		InProgress:      0.04,
	}
}

// runChaos runs the chaos test's scenario and returns what it found; it
// fails t only when the scenario itself cannot run.
func runChaos(t *testing.T, cfg chaosConfig) chaosResult {
	t.Helper()
	start := time.Now()
	rng := rand.New(rand.NewPCG(cfg.seed, 0x6368616f73)) // kill points

	srv := idemtest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct{ Order string }
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Order == "" {
			http.Error(w, "bad order", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%q,"charge":"ch_%s"}`, in.Order, uuid.NewString())
	}),
		idemtest.WithFaultRates(cfg.rates),
		idemtest.WithRetryAfter(time.Second), // capped at 10ms by the client
		idemtest.WithFaultDelay(2*time.Millisecond))
	defer srv.Close()

	journal := filepath.Join(t.TempDir(), "journal.db")
	env := []string{
		envChaosJournal + "=" + journal,
		envChaosURL + "=" + srv.URL,
		envChaosOps + "=" + strconv.Itoa(cfg.ops),
		envChaosWorkers + "=" + strconv.Itoa(cfg.workers),
	}
	if cfg.rotate {
		env = append(env, envChaosRotate+"=1")
	}
	env = append(env, envChaosUnnamed+"="+strconv.Itoa(cfg.unnamed))

	var res chaosResult
	res.ops = cfg.ops + cfg.unnamed
	// Every kill, then at most a few clean runs to finish: the loop is bounded.
	for res.children < cfg.kills+3 && !res.complete {
		res.children++
		cenv := env
		if res.kills >= cfg.kills {
			cenv = append(slices.Clone(env), envChaosFinal+"=1")
		}
		child := crashtest.Start(t, "chaos", cenv...)
		var lines []string
		if res.kills < cfg.kills {
			first, ok := child.Next()
			require.True(t, ok, "chaos child %d ended before saying anything", res.children)
			todo, err := strconv.Atoi(strings.TrimPrefix(first, "todo "))
			require.NoError(t, err, "chaos child's first line %q", first)
			// Kill after a random number of lines, spread so that each
			// remaining kill gets a share of the remaining work (a child
			// emits at least 2 lines per operation it has to do).
			left := cfg.kills - res.kills
			lines = child.KillAfter(1 + rng.IntN(max(1, 4*todo/(left+1))))
		} else {
			var err error
			lines, err = child.Wait()
			if err != nil {
				t.Logf("chaos child %d: %v", res.children, err)
			}
		}
		completed := false
		for _, l := range lines {
			verb, rest, _ := strings.Cut(l, " ")
			switch verb {
			case "resumed":
				res.resumed++
			case "gaveup":
				res.gaveUp++
			case "complete":
				completed = true
			case "fatal":
				t.Fatalf("chaos child %d: %s", res.children, rest)
			}
		}
		if completed {
			res.complete = true
		} else if res.kills < cfg.kills {
			res.kills++
		}
	}
	require.True(t, res.complete, "no chaos child completed its run in %d runs", res.children)
	res.elapsed = time.Since(start)

	st := srv.Stats()
	res.attempts, res.replays, res.conflicts, res.faults, res.performed = st.Requests, st.Replays, st.Conflicts, st.Faults, st.Runs
	for i := range cfg.ops + cfg.unnamed {
		switch runs := st.RunsByPayload[idemtest.Fingerprint(http.MethodPost, chaosPath, []byte(chaosBody(i)))]; {
		case runs == 0:
			res.lost++
		case runs > 1:
			res.duplicates++
		}
	}
	res.duplicates = max(res.duplicates, st.DuplicateKeys())

	store, err := idem.OpenBoltStore(journal, nil)
	require.NoError(t, err)
	defer store.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pend, err := store.Pending(ctx, "", cfg.ops+1)
	require.NoError(t, err)
	res.pending = len(pend)
	keys := make(map[string]bool, cfg.ops)
	for i := range cfg.ops {
		op, err := store.Named(ctx, chaosName(i))
		if err != nil {
			require.ErrorIs(t, err, idem.ErrNotFound)
			res.notSucceeded++
			continue
		}
		keys[op.Key] = true
		if op.State != idem.StateSucceeded {
			res.notSucceeded++
		}
		if st.RunsByKey[op.Key] != 1 {
			res.wrongKey++
		}
	}
	for k := range st.AttemptsByKey {
		if keys[k] {
			continue
		}
		// An unnamed operation's key: the journal must hold it all the same.
		if op, err := store.Get(ctx, k); err != nil || op.Name != "" || op.State != idem.StateSucceeded && st.RunsByKey[k] > 0 {
			res.foreignKeys++
		}
	}
	return res
}

func (r chaosResult) report(t *testing.T, seed uint64) {
	t.Helper()
	kinds := make([]string, 0, len(r.faults))
	for f, n := range r.faults {
		kinds = append(kinds, fmt.Sprintf("%v %d", f, n))
	}
	slices.Sort(kinds)
	t.Logf("chaos seed %d: %d operations, %d attempts, amplification %.3f attempts/operation, "+
		"%d handler runs, %d replays, %d conflicts, faults [%s]; "+
		"%d duplicates, %d lost, %d left pending, %d foreign keys; "+
		"%d crashes survived over %d client processes, %d operations resumed, %d given up and re-driven by a later process; elapsed %v",
		seed, r.ops, r.attempts, float64(r.attempts)/float64(max(r.ops, 1)),
		r.performed, r.replays, r.conflicts, strings.Join(kinds, ", "),
		r.duplicates, r.lost, r.pending, r.foreignKeys,
		r.kills, r.children, r.resumed, r.gaveUp, r.elapsed.Round(time.Millisecond))
}

func chaosSeedOrRandom() uint64 {
	if *chaosSeed != 0 {
		return *chaosSeed
	}
	return rand.Uint64()
}

func TestChaos(t *testing.T) {
	seed := chaosSeedOrRandom()
	t.Logf("chaos seed %d (rerun with -chaos.seed=%d)", seed, seed)
	cfg := chaosConfig{ops: *chaosOps, kills: *chaosKills, workers: *chaosWorkers, unnamed: *chaosUnnamed, seed: seed, rates: chaosFaults(seed)}
	r := runChaos(t, cfg)
	r.report(t, seed)

	assert.Zero(t, r.duplicates, "operations performed more than once")
	assert.Zero(t, r.lost, "operations never performed")
	assert.Zero(t, r.pending, "operations left pending in the journal")
	assert.Zero(t, r.foreignKeys, "keys on the wire that the journal does not hold")
	assert.Zero(t, r.wrongKey, "operations not performed exactly once under their journaled key")
	assert.Zero(t, r.notSucceeded, "operations the journal does not record as succeeded")
	assert.Equal(t, cfg.ops+cfg.unnamed, r.performed, "handler runs")
	if cfg.kills > 0 {
		assert.Positive(t, r.kills, "the client was never killed")
	}
	assert.Greater(t, r.attempts, cfg.ops, "faults caused retries")
}

// TestChaosCatchesKeyRotation checks that the chaos test's checks can
// fail: a client that sends retries under a fresh key, as a naive retry
// around an SDK that mints a key per call does, performs operations whose
// response was lost twice, and puts keys on the wire the journal never
// held.
func TestChaosCatchesKeyRotation(t *testing.T) {
	seed := chaosSeedOrRandom()
	t.Logf("chaos seed %d", seed)
	r := runChaos(t, chaosConfig{
		ops: 40, kills: 1, workers: 4, seed: seed, rotate: true,
		// Many lost responses: with 40 operations, the chance that none is
		// lost on a first attempt and retried is 0.7^40, below 1e-6.
		rates: idemtest.FaultRates{Seed: seed, DropAfter: 0.3},
	})
	r.report(t, seed)
	assert.Positive(t, r.duplicates, "a rotating client must perform some operation twice")
	assert.Positive(t, r.foreignKeys, "a rotating client must put unjournaled keys on the wire")
}
