package chaoskit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/idemgo/idem/idemtest"
)

// Orders is a provider's order endpoint: it takes a JSON object whose
// "order" names the order and answers 201 with that order and a fresh
// charge id, so that a replay is told apart from a second run. Wrap it in
// idemtest.NewServer, which counts its runs.
func Orders(w http.ResponseWriter, r *http.Request) {
	var in struct{ Order string }
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Order == "" {
		http.Error(w, "bad order", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order":%q,"charge":"ch_%s"}`, in.Order, uuid.NewString())
}

// Provider starts the provider of a chaos run: Orders under the faults
// rates, asking for a Retry-After of a second (which Retry caps) and
// delaying a delayed answer by 2 ms. Close it when the run ends.
func Provider(rates idemtest.FaultRates) *idemtest.Server {
	return idemtest.NewServer(http.HandlerFunc(Orders),
		idemtest.WithFaultRates(rates),
		idemtest.WithRetryAfter(time.Second),
		idemtest.WithFaultDelay(2*time.Millisecond))
}
