package pgstore_test

import (
	"context"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemserver"
	"github.com/idemgo/idem/pgstore"
)

// Replicas of one application share a journal in PostgreSQL: each opens
// the store (which creates or migrates its schema) and runs a Client under
// its own owner name and lease. A named operation is one key fleet-wide,
// and Resume on any replica finishes what a dead one left in doubt. It
// needs a database, so it only compiles here (no Output).
func Example() {
	ctx := context.Background()
	store, err := pgstore.Open(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	hostname, _ := os.Hostname()
	client := idem.New(store, idem.WithOwner(hostname), idem.WithLease(30*time.Second),
		idem.WithBackgroundResume(time.Minute, func(op idem.Operation, resp *http.Response, err error) {
			if resp != nil {
				resp.Body.Close()
			}
			log.Printf("resumed %s (%s): %v", op.Key, op.Name, err)
		}))
	defer client.Close() // closes the store too: it waits for calls in flight and flushes the marks

	ctx = idem.WithOperation(ctx, "pay:order-42")
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "https://api.example.com/v1/charges", nil)
	if resp, err := client.HTTPClient().Do(req); err == nil {
		resp.Body.Close()
	}
}

// The server side on the same database: idemserver's middleware keeps the
// inbound keys in a ServerStore, which may share the Store's pool.
func ExampleNewServerStore() {
	ctx := context.Background()
	store, err := pgstore.Open(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	keys, err := pgstore.NewServerStore(ctx, store.Pool())
	if err != nil {
		log.Fatal(err)
	}
	defer keys.Close() // the middleware does not close its store
	mw := idemserver.New(keys, idemserver.WithSingleTenant())
	defer mw.Close()
	http.Handle("POST /orders", mw.Required(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
}
