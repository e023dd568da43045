package idem_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemtest"
)

// A payment whose first response is lost: idem retries with the same key,
// and the provider replays the charge it already made.
func Example() {
	var charges atomic.Int64
	provider := idemtest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"charge":%d}`, charges.Add(1))
	}), idemtest.WithScript(func(key string, attempt int) idemtest.Fault {
		if attempt == 1 {
			return idemtest.DropAfter // charged, but the response is lost
		}
		return idemtest.NoFault
	}))
	defer provider.Close()

	client := idem.New(idem.NewMemoryStore(), idem.WithBackoff(time.Millisecond, 10*time.Millisecond))
	defer client.Close()

	req, _ := http.NewRequest(http.MethodPost, provider.URL+"/v1/charges", strings.NewReader(`{"amount":4200}`))
	resp, err := client.HTTPClient().Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	st := provider.Stats()
	fmt.Println(resp.StatusCode, string(body), "replayed:", resp.Header.Get("Idempotent-Replayed"))
	fmt.Println("keys:", len(st.AttemptsByKey), "charges:", charges.Load())
	// Output:
	// 200 {"charge":1} replayed: true
	// keys: 1 charges: 1
}

// A named operation keeps its key across calls (and, with the bbolt
// journal, across restarts): re-driving it never charges twice.
func ExampleWithOperation() {
	var charges atomic.Int64
	provider := idemtest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"charge":%d}`, charges.Add(1))
	}))
	defer provider.Close()
	client := idem.New(idem.NewMemoryStore())
	defer client.Close()

	ctx := idem.WithOperation(context.Background(), "pay:order-42")
	for range 2 {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, provider.URL+"/v1/charges", strings.NewReader(`{"order":42}`))
		resp, err := client.HTTPClient().Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(string(body), "replayed:", resp.Header.Get("Idempotent-Replayed") == "true")
	}
	fmt.Println("charges:", charges.Load())
	// Output:
	// {"charge":1} replayed: false
	// {"charge":1} replayed: true
	// charges: 1
}
