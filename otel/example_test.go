package idemotel_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemgo/idem"
	idemotel "github.com/idemgo/idem/otel"
)

// A client span per request written: the first attempt meets a 503, the
// retry (the same key, http.request.resend_count 1) a 201.
func Example() {
	calls := 0
	payments := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		if calls == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer payments.Close()

	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	store := idem.NewMemoryStore()
	in, err := idemotel.New(store, idemotel.WithTracerProvider(tp))
	if err != nil {
		fmt.Println(err)
		return
	}
	client := idem.New(store, idem.WithHooks(in.Hooks()), idem.WithBackoff(1, 1))
	defer client.Close()
	defer in.Shutdown() // runs first: the gauges stop reading the store

	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, payments.URL+"/v1/charges", strings.NewReader(`{"amount":4200}`))
	resp, err := client.HTTPClient().Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	for _, s := range spans.Ended() {
		var status, resends string
		for _, a := range s.Attributes() {
			switch a.Key {
			case "http.response.status_code":
				status = a.Value.String()
			case "http.request.resend_count":
				resends = a.Value.String()
			}
		}
		if resends == "" {
			resends = "absent" // the first request of an operation
		}
		fmt.Println(s.Name(), status, "resend_count:", resends)
	}
	// Output:
	// POST 503 resend_count: absent
	// POST 201 resend_count: 1
}
