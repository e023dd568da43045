package idem_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemtest"
	"github.com/idemgo/idem/internal/chaoskit"
	"github.com/idemgo/idem/internal/crashtest"
)

// The chaos test drives many named operations through an idemtest server
// (in this, the parent, process) that faults about a third of the attempts,
// from a client in a child process that is SIGKILLed at random moments and
// restarted. Each child opens the journal, learns from it which operations
// are already done, resumes the pending ones, and re-drives the rest by
// name. At the end every operation must have been performed exactly once
// under its journaled key, none lost, and nothing left pending. The driver
// (flags, kill schedule, ledger) is internal/chaoskit's.
//
// The default configuration is short enough for CI. The long one:
//
//	go test -run '^TestChaos$' -v -chaos.ops=10000 -chaos.kills=50 .
//
// Faults are drawn from the seed and each request's key; keys are random
// UUIDs (as idem promises), so a seed reproduces the kill points and the
// fault rates, not the exact fault of every request.
var (
	chaosFlags   = chaoskit.NewFlags("chaos", "chaos test", 200, 4, 8)
	chaosUnnamed = flag.Int("chaos.unnamed", 50, "chaos test: operations of a caller that retries on its own, without a name")
)

func init() { crashChildren["chaos"] = childChaos }

// Environment of a chaos child, beside chaoskit.Env.
const (
	envChaosJournal = "IDEM_CHAOS_JOURNAL"
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

// rotateRT plays a broken client: every attempt after the first one of a
// key, in this process, goes out under a fresh key.
type rotateRT struct {
	base http.RoundTripper
	mu   sync.Mutex
	seen map[string]int
}

func (c *rotateRT) RoundTrip(r *http.Request) (*http.Response, error) {
	key := r.Header.Get("Idempotency-Key")
	c.mu.Lock()
	c.seen[key]++
	n := c.seen[key]
	c.mu.Unlock()
	if n > 1 {
		r = r.Clone(r.Context())
		r.Header.Set("Idempotency-Key", uuid.NewString())
	}
	return c.base.RoundTrip(r)
}

// childChaos is one life of the chaos client. It keeps no state outside the
// journal: what is done is what the journal records as succeeded. Its
// lines are chaoskit's, with "done <name> <status>" per re-driven
// operation.
func childChaos() int {
	ctx, stop := chaoskit.Life("chaos child", chaosChildLimit)
	defer stop()
	env, err := chaoskit.ReadEnv()
	if err != nil {
		return chaoskit.Fatal(err)
	}
	journal, n := os.Getenv(envChaosJournal), env.Ops

	// What is done, according to the journal.
	store, err := idem.OpenBoltStore(journal, &idem.BoltOptions{LockTimeout: 10 * time.Second})
	if err != nil {
		return chaoskit.Fatal(err)
	}
	done, todo, err := chaoskit.Done(ctx, store.Named, chaoskit.Names(n, chaosName))
	if err != nil {
		store.Close()
		return chaoskit.Fatal(err)
	}
	if err := store.Close(); err != nil {
		return chaoskit.Fatal(err)
	}
	crashtest.Emit("todo", strconv.Itoa(todo))

	var base http.RoundTripper // chaoskit's: no silent resends by net/http
	if os.Getenv(envChaosRotate) == "1" {
		base = &rotateRT{base: &http.Transport{DisableKeepAlives: true}, seen: make(map[string]int)}
	}
	store, err = idem.OpenBoltStore(journal, &idem.BoltOptions{LockTimeout: 10 * time.Second})
	if err != nil {
		return chaoskit.Fatal(err)
	}
	client := idem.New(store, chaoskit.ClientOptions(base, env.Workers)...)
	defer client.Close()

	// Resume what a crash interrupted.
	index := make(map[string]int, n)
	for i := range n {
		index[chaosName(i)] = i
	}
	var mu sync.Mutex
	err = client.Resume(ctx, func(op idem.Operation, resp *http.Response, err error) {
		if resp != nil {
			ok := chaoskit.Answer(resp, op.Name)
			if i, named := index[op.Name]; named && ok {
				mu.Lock()
				done[i] = true
				mu.Unlock()
			}
		}
		crashtest.Emit("resumed", op.Name, chaoskit.Status(resp))
	})
	if err != nil {
		return chaoskit.Fatal(err)
	}

	// Re-drive the rest by name.
	unnamed, _ := strconv.Atoi(os.Getenv(envChaosUnnamed))
	if os.Getenv(envChaosFinal) != "1" {
		unnamed = 0 // a caller without a name has nothing durable to re-drive by after a crash
	}
	jobs := func(yield func(int) bool) {
		for i := range n {
			mu.Lock()
			skip := done[i]
			mu.Unlock()
			if !skip && !yield(i) {
				return
			}
		}
		for i := n; i < n+unnamed; i++ {
			if !yield(i) {
				return
			}
		}
	}
	failed := chaoskit.Pool(env.Workers, jobs, func(i int) bool {
		if !chaosDrive(ctx, client.HTTPClient(), env.URL, i, i < n) {
			crashtest.Emit("gaveup", chaosName(i))
			return false
		}
		return true
	})
	if err := client.Close(); err != nil {
		return chaoskit.Fatal(err)
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
	return chaoskit.Try(ctx, 10, 5*time.Millisecond, func(try int) (bool, error) {
		octx := ctx
		if named {
			octx = idem.WithOperation(ctx, name)
		}
		octx, cancel := context.WithTimeout(octx, 30*time.Second)
		defer cancel()
		req, err := chaoskit.Post(octx, url+chaosPath, chaosBody(i))
		if err != nil {
			return false, err
		}
		if !named {
			req.Header.Set("X-Retry-Count", strconv.Itoa(try)) // volatile, as an SDK's
		}
		resp, err := hc.Do(req)
		if err != nil {
			return false, nil // in doubt: the same name, or the same payload, is the same key
		}
		if !chaoskit.Answer(resp, name) {
			return false, nil
		}
		crashtest.Emit("done", name, strconv.Itoa(resp.StatusCode))
		return true, nil
	})
}

// chaosConfig is one run of the chaos test.
type chaosConfig struct {
	ops, kills, workers int
	unnamed             int // operations a caller without a name drives in the last child
	seed                uint64
	rates               idemtest.FaultRates
	rotate              bool // the child plays a client that rotates keys
}

// chaosResult is what a chaos run found: the ledger, and the lives of the
// client.
type chaosResult struct {
	*chaoskit.Ledger
	kills, children, resumed, gaveUp int
	complete                         bool
	elapsed                          time.Duration
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

	srv := chaoskit.Provider(cfg.rates) // Retry-After capped at 10ms by the client
	defer srv.Close()

	journal := filepath.Join(t.TempDir(), "journal.db")
	env := append(chaoskit.Env{URL: srv.URL, Ops: cfg.ops, Workers: cfg.workers}.Vars(), envChaosJournal+"="+journal)
	if cfg.rotate {
		env = append(env, envChaosRotate+"=1")
	}
	env = append(env, envChaosUnnamed+"="+strconv.Itoa(cfg.unnamed))

	var res chaosResult
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
			// A child emits at least 2 lines per operation it has to do.
			var err error
			lines, err = chaoskit.KillLife(child, rng, 4, cfg.kills-res.kills)
			require.NoError(t, err, "chaos child %d", res.children)
		} else {
			var err error
			lines, err = child.Wait()
			if err != nil {
				t.Logf("chaos child %d: %v", res.children, err)
			}
		}
		said := chaoskit.Scan(lines)
		for _, msg := range said.Fatal {
			t.Fatalf("chaos child %d: %s", res.children, msg)
		}
		res.resumed += said.Resumed
		res.gaveUp += said.GaveUp
		if said.Complete {
			res.complete = true
		} else if res.kills < cfg.kills {
			res.kills++
		}
	}
	require.True(t, res.complete, "no chaos child completed its run in %d runs", res.children)
	res.elapsed = time.Since(start)

	st := srv.Stats()
	res.Ledger = chaoskit.Tally(st, chaoskit.PostCharges(st, cfg.ops+cfg.unnamed, chaosPath, chaosBody))

	store, err := idem.OpenBoltStore(journal, nil)
	require.NoError(t, err)
	defer store.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pend, err := store.Pending(ctx, "", cfg.ops+1)
	require.NoError(t, err)
	res.Pending = len(pend)
	require.NoError(t, res.Named(ctx, store.Named, chaoskit.Names(cfg.ops, chaosName)))
	res.Foreign(func(k string, runs int) bool {
		// An unnamed operation's key: the journal must hold it all the same.
		op, err := store.Get(ctx, k)
		return err == nil && op.Name == "" && (op.State == idem.StateSucceeded || runs == 0)
	})
	return res
}

func (r chaosResult) report(t *testing.T, seed uint64) {
	t.Helper()
	t.Logf("chaos seed %d: %v; %d crashes survived over %d client processes, %d operations resumed, %d given up and re-driven by a later process; elapsed %v",
		seed, r.Ledger, r.kills, r.children, r.resumed, r.gaveUp, r.elapsed.Round(time.Millisecond))
}

func TestChaos(t *testing.T) {
	seed := chaosFlags.Seed(t)
	cfg := chaosConfig{ops: *chaosFlags.Ops, kills: *chaosFlags.Kills, workers: *chaosFlags.Workers, unnamed: *chaosUnnamed, seed: seed, rates: chaosFaults(seed)}
	r := runChaos(t, cfg)
	r.report(t, seed)

	r.Assert(t)
	if cfg.kills > 0 {
		assert.Positive(t, r.kills, "the client was never killed")
	}
	assert.Greater(t, r.Requests, cfg.ops, "faults caused retries")
}

// TestChaosCatchesKeyRotation checks that the chaos test's checks can
// fail: a client that sends retries under a fresh key, as a naive retry
// around an SDK that mints a key per call does, performs operations whose
// response was lost twice, and puts keys on the wire the journal never
// held.
func TestChaosCatchesKeyRotation(t *testing.T) {
	seed := chaosFlags.Seed(t)
	r := runChaos(t, chaosConfig{
		ops: 40, kills: 1, workers: 4, seed: seed, rotate: true,
		// Many lost responses: with 40 operations, the chance that none is
		// lost on a first attempt and retried is 0.7^40, below 1e-6.
		rates: idemtest.FaultRates{Seed: seed, DropAfter: 0.3},
	})
	r.report(t, seed)
	assert.Positive(t, r.Duplicates, "a rotating client must perform some operation twice")
	assert.Positive(t, r.ForeignKeys, "a rotating client must put unjournaled keys on the wire")
}
