package idemserver_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemgo/idem/idemserver"
)

// A handler behind the middleware runs once per key: the client's retry
// with the same key and payload gets the stored answer, marked replayed,
// and the same key with another payload is refused with 422.
func Example() {
	orders := 0
	mw := idemserver.New(idemserver.NewMemoryStore(), idemserver.WithSingleTenant())
	defer mw.Close()
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Required(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orders++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, orders)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	post := func(key, body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode >= 400 {
			fmt.Println(resp.StatusCode, resp.Header.Get("Content-Type")) // a problem document
			return
		}
		if resp.Header.Get(idemserver.ReplayedHeader) == "true" {
			b = append(b, " (replayed)"...)
		}
		fmt.Println(resp.StatusCode, string(b))
	}
	post("key-1", `{"sku":"tea"}`)
	post("key-1", `{"sku":"tea"}`)  // the client's retry
	post("key-1", `{"sku":"cake"}`) // another payload under the same key
	post("key-2", `{"sku":"cake"}`)
	fmt.Println("orders placed:", orders)
	// Output:
	// 201 {"order":1}
	// 201 {"order":1} (replayed)
	// 422 application/problem+json
	// 201 {"order":2}
	// orders placed: 2
}
