package idemtest_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/idemgo/idem/idemtest"
)

// chargeHandler stands for a payment provider's "charge a card" endpoint.
var chargeHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprint(w, `{"id":"ch_1","status":"succeeded"}`)
})

// charge posts body with the key and prints what came back.
func charge(c *http.Client, url, key, body string) {
	req, _ := http.NewRequest(http.MethodPost, url+"/charges", strings.NewReader(body))
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.Do(req)
	if err != nil {
		fmt.Println("network error, outcome unknown")
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, "replayed:", resp.Header.Get(idemtest.ReplayedHeader) == "true")
	if resp.Header.Get("Content-Type") == "application/problem+json" {
		var p struct{ Title string }
		json.Unmarshal(b, &p)
		fmt.Println(p.Title)
	} else {
		fmt.Println(string(b))
	}
}

// The first attempt's response is lost after the card was charged. The
// retry carries the same key, so the server replays the stored response
// instead of charging again.
func ExampleServer_lostResponse() {
	srv := idemtest.NewServer(chargeHandler,
		idemtest.WithScript(func(key string, attempt int) idemtest.Fault {
			if attempt == 1 {
				return idemtest.DropAfter
			}
			return idemtest.NoFault
		}))
	defer srv.Close()

	charge(srv.Client(), srv.URL, "order-42", `{"amount":1000}`)
	charge(srv.Client(), srv.URL, "order-42", `{"amount":1000}`) // retry, same key

	st := srv.Stats()
	fmt.Println("attempts:", st.AttemptsByKey["order-42"], "charges:", st.RunsByKey["order-42"], "replays:", st.Replays)
	// Output:
	// network error, outcome unknown
	// 201 replayed: true
	// {"id":"ch_1","status":"succeeded"}
	// attempts: 2 charges: 1 replays: 1
}

// A key reused with a different payload is refused with 422 and a problem
// document; the first payload's result stands.
func ExampleServer_keyReused() {
	srv := idemtest.NewServer(chargeHandler)
	defer srv.Close()

	charge(srv.Client(), srv.URL, "order-42", `{"amount":1000}`)
	charge(srv.Client(), srv.URL, "order-42", `{"amount":9999}`)

	fmt.Println("charges:", srv.Stats().Runs, "mismatches:", srv.Stats().Mismatches)
	// Output:
	// 201 replayed: false
	// {"id":"ch_1","status":"succeeded"}
	// 422 replayed: false
	// Idempotency-Key is already used
	// charges: 1 mismatches: 1
}
