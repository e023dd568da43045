// Command basic shows idem's core promise in one request: a payment POST
// whose first response is lost and whose second attempt meets a 503 is
// retried with the same Idempotency-Key and the same body, and the
// provider charges the card exactly once.
//
// It shows:
//   - idem.Open: the embedded bbolt journal (in a temp dir, removed at exit);
//   - Client.HTTPClient: a plain *http.Client that any SDK accepts;
//   - one key on every attempt, read from the server's own counters;
//   - the provider (an in-process idemtest server) performing it once.
//
// Run it with: go run ./examples/basic
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemtest"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	// The payment provider: charges a card, behind idemtest's server side of
	// the Idempotency-Key draft. Attempt 1 is performed but its response is
	// lost; attempt 2 gets a 503; attempt 3 goes through.
	var charges atomic.Int64
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := charges.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ch_%d","amount":4200}`, n)
	})
	script := func(key string, attempt int) idemtest.Fault {
		switch attempt {
		case 1:
			return idemtest.DropAfter
		case 2:
			return idemtest.Unavailable
		}
		return idemtest.NoFault
	}
	provider := idemtest.NewServer(charge, idemtest.WithScript(script), idemtest.WithRetryAfter(0))
	defer provider.Close()

	dir, err := os.MkdirTemp("", "idem-basic-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	journal := filepath.Join(dir, "journal.db")

	client, err := idem.Open(journal, idem.WithBackoff(50*time.Millisecond, time.Second))
	if err != nil {
		return err
	}
	defer client.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, provider.URL+"/v1/charges", strings.NewReader(`{"amount":4200,"currency":"eur"}`))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.HTTPClient().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}

	st := provider.Stats()
	fmt.Printf("response:      %d %s (replayed: %s)\n", resp.StatusCode, body, resp.Header.Get(idemtest.ReplayedHeader))
	for key, n := range st.AttemptsByKey {
		fmt.Printf("attempts:      %d, every one with Idempotency-Key %s\n", n, key)
	}
	fmt.Printf("faults:        %d lost response, %d × 503\n", st.Faults[idemtest.DropAfter], st.Faults[idemtest.Unavailable])
	fmt.Printf("card charged:  %d time(s)\n", charges.Load())
	fmt.Printf("journal:       %s (removed at exit)\n", journal)
	if charges.Load() != 1 || len(st.AttemptsByKey) != 1 {
		return fmt.Errorf("expected one charge under one key, got %d charges under %d keys", charges.Load(), len(st.AttemptsByKey))
	}
	return nil
}
