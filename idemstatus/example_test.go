package idemstatus_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemstatus"
)

// The live page of a Client: a Collector counts what the Client's hooks
// report, and Handler shows it with the journal's pending operations.
// Mount it where operators can reach it (often /debug/idem).
func Example() {
	payments := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	defer payments.Close()

	store := idem.NewMemoryStore()
	counts := idemstatus.NewCollector(0)
	client := idem.New(store, idem.WithHooks(counts.Hooks()))
	defer client.Close()

	ctx := idem.WithOperation(context.Background(), "pay:order-42")
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, payments.URL+"/v1/charges", strings.NewReader(`{"amount":4200}`))
	resp, err := client.HTTPClient().Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close() // the operation settles once its answer is read

	page := httptest.NewRecorder()
	idemstatus.Handler(store, counts).ServeHTTP(page, httptest.NewRequest(http.MethodGet, "/debug/idem?format=json", nil))
	fmt.Println(page.Code, page.Header().Get("Content-Type"))
	fmt.Println("succeeded:", counts.Counts().Settled["succeeded"])
	// Output:
	// 200 application/json
	// succeeded: 1
}
