// Command crashresume shows crash recovery for real: a shop process starts
// a payment, the provider performs it, and the shop is SIGKILLed before the
// response arrives — the moment that turns a naive retry into a double
// charge. The restarted shop opens its journal, resumes the payment with
// its original Idempotency-Key, and the provider replays its stored result.
//
// It shows:
//   - the key journaled (fsynced) before the request left the process;
//   - a real crash: the program re-executes itself as a child and kills it
//     with SIGKILL mid-flight;
//   - Client.Resume finishing the operation with its original key;
//   - WithOperation: re-driving "pay:order-42" after the restart gets the
//     same key, so the card is still charged exactly once.
//
// Run it with: go run ./examples/crashresume
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemtest"
)

const operation = "pay:order-42"

func main() {
	if len(os.Args) == 4 && os.Args[1] == "shop" {
		// The child: the shop before the crash.
		if err := shop(os.Args[2], os.Args[3]); err != nil {
			log.Fatal(err)
		}
		return
	}
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

// shop opens the journal and pays order 42. It never returns normally in
// this demo: the parent kills it while the provider holds the response.
func shop(journal, url string) error {
	client, err := idem.Open(journal)
	if err != nil {
		return err
	}
	defer client.Close()
	resp, err := pay(client, url)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return errors.New("the shop was not killed")
}

// pay sends the payment for order 42 as the named operation, with the
// shop's credentials.
func pay(client *idem.Client, url string) (*http.Response, error) {
	ctx := idem.WithOperation(context.Background(), operation)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/charges", strings.NewReader(`{"order":42,"amount":4200}`))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk_test_shop")
	return client.HTTPClient().Do(req)
}

func run() error {
	dir, err := os.MkdirTemp("", "idem-crashresume-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	journal := filepath.Join(dir, "journal.db")

	// The provider charges a card. On the first charge it tells us, and
	// holds the response until the shop is dead.
	var charges atomic.Int64
	performed := make(chan struct{})
	killed := make(chan struct{})
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "" {
			http.Error(w, "no credentials", http.StatusUnauthorized)
			return
		}
		n := charges.Add(1)
		if n == 1 {
			close(performed)
			<-killed
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ch_%d","order":42}`, n)
	})
	provider := idemtest.NewServer(charge)
	defer provider.Close()

	fmt.Println("1. shop (child process) pays order 42 ...")
	child := exec.Command(os.Args[0], "shop", journal, provider.URL)
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		return err
	}
	select {
	case <-performed:
	case <-time.After(30 * time.Second):
		child.Process.Kill()
		return errors.New("the provider never saw the payment")
	}
	fmt.Println("2. provider charged the card; the shop is killed (SIGKILL) before the response arrives")
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	werr := child.Wait()
	close(killed)
	fmt.Printf("   shop exited: %v\n", werr)

	fmt.Println("3. shop restarts, opens its journal and resumes")
	client, err := idem.Open(journal, idem.WithResumePrepare(func(r *http.Request) error {
		r.Header.Set("Authorization", "Bearer sk_test_shop") // credentials are never journaled
		return nil
	}))
	if err != nil {
		return err
	}
	defer client.Close()
	var resumed []string
	err = client.Resume(context.Background(), func(op idem.Operation, resp *http.Response, err error) {
		if err != nil {
			resumed = append(resumed, fmt.Sprintf("%s key %s: %v", op.Name, op.Key, err))
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		resumed = append(resumed, fmt.Sprintf("%s key %s: %d %s (replayed: %s)", op.Name, op.Key, resp.StatusCode, b, resp.Header.Get(idemtest.ReplayedHeader)))
	})
	if err != nil {
		return err
	}
	for _, r := range resumed {
		fmt.Println("   resumed", r)
	}

	fmt.Println("4. the shop re-drives", operation, "by name: same key, replayed")
	resp, err := pay(client, provider.URL)
	if err != nil {
		return err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Printf("   %d %s (replayed: %s)\n", resp.StatusCode, b, resp.Header.Get(idemtest.ReplayedHeader))

	st := provider.Stats()
	fmt.Printf("5. keys the provider saw: %d; requests: %d; card charged: %d time(s)\n", len(st.AttemptsByKey), st.Requests, charges.Load())
	if charges.Load() != 1 || len(resumed) != 1 || len(st.AttemptsByKey) != 1 {
		return fmt.Errorf("expected one charge, one resumed operation and one key")
	}
	return nil
}
