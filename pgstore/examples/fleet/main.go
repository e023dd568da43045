// Command fleet shows three replicas of a shop sharing one idem journal in
// PostgreSQL: a payment survives the death of the replica that started it,
// and a payment sent by two replicas at once is charged once.
//
// It shows:
//   - pgstore.Open creating its schema, and replicas (real child processes
//     of this program) opening the same journal;
//   - replica a killed with SIGKILL in the middle of a payment: the
//     provider charged the card, a never got the answer;
//   - the customer's retry landing on replica b: WithOperation gives the
//     same key fleet-wide; b waits until a's lease lapses (WithLease, 2 s
//     here) and sends it again, and the provider replays the charge
//     instead of charging again;
//   - Resume on b leaving a's payment alone while a's lease is live;
//   - replicas b and c paying the same orders at the same moment: one key
//     per order, one charge per order.
//
// It needs a PostgreSQL server (the role must be allowed to create a
// schema; the program drops the schema it made when it ends):
//
//	IDEM_TEST_POSTGRES=postgres://user:pass@127.0.0.1:5432/db go run ./examples/fleet
//	go run ./examples/fleet -dsn postgres://user:pass@127.0.0.1:5432/db
//
// (IDEM_TEST_POSTGRES is the variable pgstore's tests read, so one URL
// serves both.)
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemtest"
	"github.com/idemgo/idem/pgstore"
)

// lease is how long a replica's claim on an operation lasts without
// renewal (30 s by default; short here so the demo does not wait long).
const lease = 2 * time.Second

// Environment of a replica child.
const (
	envDSN    = "IDEM_FLEET_EXAMPLE_DSN"
	envSchema = "IDEM_FLEET_EXAMPLE_SCHEMA"
	envURL    = "IDEM_FLEET_EXAMPLE_URL"
)

func main() {
	if len(os.Args) > 2 && os.Args[1] == "replica" {
		if err := replica(os.Args[2], os.Args[3:]); err != nil {
			log.Fatalf("replica %s: %v", os.Args[2], err)
		}
		return
	}
	dsn := flag.String("dsn", os.Getenv("IDEM_TEST_POSTGRES"), "PostgreSQL URL of the shared journal (default $IDEM_TEST_POSTGRES)")
	flag.Parse()
	if *dsn == "" {
		fmt.Fprintln(os.Stderr, "fleet: no PostgreSQL given: set IDEM_TEST_POSTGRES=postgres://user:pass@host:5432/db or pass -dsn; nothing was run")
		os.Exit(2)
	}
	if err := run(context.Background(), *dsn, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// replica is one replica of the shop: it opens the shared journal, resumes
// what it may, and pays orders one after the other, printing one line per
// outcome.
func replica(name string, orders []string) error {
	ctx := context.Background()
	store, err := pgstore.Open(ctx, os.Getenv(envDSN), pgstore.WithSchema(os.Getenv(envSchema)))
	if err != nil {
		return err
	}
	client := idem.New(store,
		idem.WithOwner("replica-"+name), // whose lease an operation is under
		idem.WithLease(lease),
		idem.WithRetryPolicy(idem.RetryPolicy{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond, RetryAfterCap: 100 * time.Millisecond}))
	defer client.Close()

	resumed := 0
	err = client.Resume(ctx, func(op idem.Operation, resp *http.Response, err error) {
		if resp != nil {
			resp.Body.Close()
		}
		resumed++
	})
	if err != nil {
		return err
	}
	// Say what Resume left, as the journal has it: operations under
	// another replica's live lease are that replica's to finish.
	leased := 0
	pending, err := client.Pending(ctx, "", 100)
	if err != nil {
		return err
	}
	now := time.Now()
	for _, op := range pending {
		if op.Owner != "replica-"+name && op.LeaseUntil.After(now) {
			leased++
		}
	}
	line := fmt.Sprintf("Resume finished %d operation(s)", resumed)
	if leased > 0 {
		line += fmt.Sprintf("; it left %d under another replica's live lease to that replica", leased)
	}
	fmt.Println(line)

	url := os.Getenv(envURL)
	for _, order := range orders {
		start := time.Now()
		status, body, replayed, err := pay(ctx, client, url, name, order)
		took := time.Since(start).Round(100 * time.Millisecond)
		if err != nil {
			fmt.Printf("%s: %v (after %v)\n", order, err, took)
			continue
		}
		fmt.Printf("%s: %d %s (replayed: %v, after %v)\n", order, status, body, replayed, took)
	}
	return client.Close()
}

// pay sends the charge for order as the named operation "pay:<order>".
func pay(ctx context.Context, client *idem.Client, url, replica, order string) (int, string, bool, error) {
	req, err := http.NewRequestWithContext(idem.WithOperation(ctx, "pay:"+order), http.MethodPost,
		url+"/v1/charges", strings.NewReader(fmt.Sprintf(`{"order":%q,"amount":4200}`, order)))
	if err != nil {
		return 0, "", false, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Replica", replica)
	resp, err := client.HTTPClient().Do(req)
	if err != nil {
		return 0, "", false, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b)), resp.Header.Get(idemtest.ReplayedHeader) == "true", err
}

// start runs this program as replica name paying orders, with its output
// prefixed by its name.
func start(name string, env []string, orders ...string) (*exec.Cmd, <-chan struct{}, error) {
	cmd := exec.Command(os.Args[0], append([]string{"replica", name}, orders...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			fmt.Printf("   replica %s: %s\n", name, sc.Text())
		}
	}()
	return cmd, done, nil
}

func run(ctx context.Context, dsn string, out io.Writer) error {
	var b [4]byte
	rand.Read(b[:])
	schema := "idem_fleet_example_" + hex.EncodeToString(b[:])
	journal, err := pgstore.Open(ctx, dsn, pgstore.WithSchema(schema))
	if err != nil {
		return err
	}
	defer func() {
		journal.Pool().Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		journal.Close()
	}()

	// The provider charges a card per order. Replica a's charge of
	// order-3 is performed, then held until a is dead.
	var mu sync.Mutex
	charges := map[string]int{}
	chargedBy := map[string]string{} // the replica whose request ran the charge
	performed, killed := make(chan struct{}), make(chan struct{})
	provider := idemtest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var order string
		body, _ := io.ReadAll(r.Body)
		if _, rest, ok := strings.Cut(string(body), `"order":"`); ok {
			order, _, _ = strings.Cut(rest, `"`)
		}
		mu.Lock()
		charges[order]++
		n := charges[order]
		if n == 1 {
			chargedBy[order] = r.Header.Get("X-Replica")
		}
		mu.Unlock()
		if order == "order-3" && r.Header.Get("X-Replica") == "a" {
			close(performed)
			<-killed
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%q,"charge":"ch_%s_%d"}`, order, order, n)
	}))
	defer provider.Close()
	env := []string{envDSN + "=" + dsn, envSchema + "=" + schema, envURL + "=" + provider.URL}

	fmt.Fprintf(out, "1. journal: PostgreSQL schema %s; replica a pays order-1, order-2, order-3\n", schema)
	a, aOut, err := start("a", env, "order-1", "order-2", "order-3")
	if err != nil {
		return err
	}
	select {
	case <-performed:
	case <-time.After(time.Minute):
		a.Process.Kill()
		return errors.New("the provider never saw order-3")
	}
	fmt.Fprintln(out, "2. the provider charged order-3; replica a is killed (SIGKILL) before the answer reaches it")
	if err := a.Process.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	<-aOut
	fmt.Fprintf(out, "   replica a: %v\n", a.Wait())
	close(killed)

	fmt.Fprintf(out, "3. the customer retries order-3 on replica b, which waits for a's lease (%v) to lapse; b and c, side by side, both pay order-4 and order-5\n", lease)
	bCmd, bOut, err := start("b", env, "order-3", "order-4", "order-5")
	if err != nil {
		return err
	}
	cCmd, cOut, err := start("c", env, "order-4", "order-5", "order-6")
	if err != nil {
		return err
	}
	<-bOut
	<-cOut
	if err := errors.Join(bCmd.Wait(), cCmd.Wait()); err != nil {
		return err
	}

	fmt.Fprintln(out, "4. the journal and the provider:")
	st := provider.Stats()
	var bad []string
	for i := 1; i <= 6; i++ {
		order := fmt.Sprintf("order-%d", i)
		var key, owner string
		var state int
		err := journal.Pool().QueryRow(ctx, `SELECT key, state, owner FROM `+pgx.Identifier{schema, "operations"}.Sanitize()+` WHERE name = $1`, "pay:"+order).Scan(&key, &state, &owner)
		if err != nil {
			return fmt.Errorf("%s: %w", order, err)
		}
		mu.Lock()
		n, by := charges[order], chargedBy[order]
		mu.Unlock()
		// owner is the replica that held the operation last and wrote its
		// finish mark; by is the one whose request the provider ran.
		fmt.Fprintf(out, "   %s: key %s, %s (finish mark by %s); %d request(s) under that key; charged %d time(s), by replica %s's request\n",
			order, key, idem.State(state), owner, st.AttemptsByKey[key], n, by)
		if n != 1 || idem.State(state) != idem.StateSucceeded {
			bad = append(bad, order)
		}
	}
	fmt.Fprintf(out, "5. keys the provider saw: %d for 6 orders; charges: %d; replays: %d\n", len(st.AttemptsByKey), st.Runs, st.Replays)
	if len(bad) > 0 || len(st.AttemptsByKey) != 6 {
		return fmt.Errorf("expected 6 keys and one charge per order; wrong: %v", bad)
	}
	return nil
}
