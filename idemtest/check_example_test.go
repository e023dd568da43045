package idemtest_test

import (
	"context"
	"fmt"
	"net/http"

	"github.com/idemgo/idem/idemtest"
)

// ExampleCheck runs the check in a CI pipeline against a sandbox; here the
// sandbox is idemtest's own server, which honours keys.
func ExampleCheck() {
	srv := idemtest.NewServer(&charger{}, idemtest.WithRetryAfter(0))
	defer srv.Close()

	rep, err := idemtest.Check(context.Background(), idemtest.CheckConfig{
		URL:    srv.URL + "/v1/charges",
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   `{"amount":4200,"currency":"eur","order":"{{uuid}}"}`,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range rep.Results {
		fmt.Println(r.Scenario, r.Verdict)
	}
	fmt.Println("conforms:", rep.Conforms)
	// Output:
	// replay pass
	// other-payload pass
	// concurrent pass
	// cut-connection pass
	// replay-marker pass
	// conforms: true
}
