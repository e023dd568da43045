package pgstore_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemserver"
	"github.com/idemgo/idem/internal/crashtest"
	"github.com/idemgo/idem/pgstore"
	"github.com/idemgo/idem/pgstore/internal/pgtest"
)

// modeServerTx is the crash child of TestServerTxSIGKILL. It is run from
// init, before TestMain, so that the shared TestMain needs no entry.
const modeServerTx = "server-tx"

func init() {
	if crashtest.Mode() == modeServerTx {
		os.Exit(serverTxChild())
	}
}

// crashLease is the lease of the crash child's key: the parent's retry
// waits for it to lapse, in real time.
const crashLease = time.Second

// orderHandler inserts the order row for the request's key, in the
// request's transaction (write=tx) or straight into the pool (write=pool,
// the mistake the transaction prevents), then calls after.
func orderHandler(s *pgstore.ServerStore, table, write string, after func(w http.ResponseWriter)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, _ := idemserver.RequestKey(r.Context())
		q := `INSERT INTO ` + table + ` (key) VALUES ($1)`
		var err error
		if write == "tx" {
			_, err = pgstore.Tx(r.Context()).Exec(r.Context(), q, key)
		} else {
			_, err = s.Pool().Exec(r.Context(), q, key)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		after(w)
	})
}

// serverTxChild handles one order and is killed after its row is written
// and before its answer is stored.
func serverTxChild() int {
	ctx := context.Background()
	s, err := pgstore.OpenServerStore(ctx, os.Getenv("IDEM_DSN"), pgstore.WithSchema(os.Getenv("IDEM_SCHEMA")))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	table := pgx.Identifier{s.Schema(), "orders"}.Sanitize()
	h := idemserver.New(s, idemserver.WithSingleTenant(), idemserver.WithLease(crashLease)).Required(orderHandler(s, table, os.Getenv("IDEM_WRITE"), func(http.ResponseWriter) {
		crashtest.Emit("inserted")
		select {} // killed here: the row is written, the answer not stored
	}))
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"sku":"x"}`))
	r.Header.Set("Idempotency-Key", "order-1")
	h.ServeHTTP(httptest.NewRecorder(), r)
	return 1 // not reached
}

// TestServerTxSIGKILL kills a replica between its handler's insert and the
// stored answer, then retries the request on another: with the request's
// transaction there is one row for the key; with the handler writing in a
// transaction of its own (the mistake), there are two.
func TestServerTxSIGKILL(t *testing.T) {
	dsn := pgtest.DSN(t)
	for _, tt := range []struct {
		write string
		rows  int
	}{{"tx", 1}, {"pool", 2}} {
		t.Run(tt.write, func(t *testing.T) {
			schema := pgtest.Schema(t, dsn)
			s := openServerStore(t, dsn, schema)
			table := pgx.Identifier{schema, "orders"}.Sanitize()
			_, err := s.Pool().Exec(testContext(t), `CREATE TABLE `+table+` (key text NOT NULL)`) // no unique key: the mistake shows
			require.NoError(t, err)
			child := crashtest.Start(t, modeServerTx, "IDEM_DSN="+dsn, "IDEM_SCHEMA="+schema, "IDEM_WRITE="+tt.write)
			require.Equal(t, []string{"inserted"}, child.KillWhen(func(l string) bool { return l == "inserted" }))

			h := idemserver.New(s, idemserver.WithSingleTenant(), idemserver.WithLease(crashLease)).Required(orderHandler(s, table, tt.write, func(w http.ResponseWriter) {
				w.WriteHeader(http.StatusCreated)
			}))
			var w *httptest.ResponseRecorder
			for i := 0; ; i++ { // the app's retries, until the dead replica's lease lapses
				w = postKey(t, h, "order-1", `{"sku":"x"}`)
				if w.Code != http.StatusConflict || i == 100 {
					break
				}
				time.Sleep(crashLease / 10)
			}
			require.Equal(t, http.StatusCreated, w.Code, w.Body.String())
			assert.Equal(t, tt.rows, countRows(t, s, table, "order-1"), "rows for the one key")
		})
	}
}
