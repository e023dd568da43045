package idemtest

import (
	"errors"
	"fmt"
)

// Fault is a failure the server injects into one request.
type Fault uint8

// The faults a Server can inject.
const (
	// NoFault lets the request through untouched.
	NoFault Fault = iota
	// DropBefore closes the connection before the request is handled: the
	// client sees a network error and nothing was performed.
	DropBefore
	// DropAfter handles the request as usual and keeps its result, then
	// closes the connection without writing the response: the client sees
	// a network error although the operation was performed. This lost
	// response is what turns a blind retry into a double charge.
	DropAfter
	// Delay holds the request for the fault delay (see WithFaultDelay),
	// then handles it as usual.
	Delay
	// Unavailable answers 503 Service Unavailable without handling the
	// request.
	Unavailable
	// TooManyRequests answers 429 Too Many Requests with Retry-After
	// without handling the request.
	TooManyRequests
	// InProgress answers 409 Conflict with Retry-After, as if an earlier
	// request with the same key were still being handled, without handling
	// the request.
	InProgress

	numFaults = iota
)

// String returns the fault's name in kebab case, such as "drop-after".
func (f Fault) String() string {
	switch f {
	case NoFault:
		return "none"
	case DropBefore:
		return "drop-before"
	case DropAfter:
		return "drop-after"
	case Delay:
		return "delay"
	case Unavailable:
		return "unavailable"
	case TooManyRequests:
		return "too-many-requests"
	case InProgress:
		return "in-progress"
	}
	return fmt.Sprintf("Fault(%d)", uint8(f))
}

// FaultRates gives the probability, between 0 and 1, that a request suffers
// each fault. At most one fault hits a request, so the rates must sum to 1
// or less; the rest is the share of requests left alone.
//
// The draw for a request depends only on Seed, the request's key and its
// attempt number for that key, not on the order in which requests arrive:
// a run with the same seed and the same keys sees the same faults at the
// same attempts even when requests run concurrently. Requests without a key
// share the key "" and are numbered in arrival order.
type FaultRates struct {
	// Seed selects the sequence of draws.
	Seed uint64
	// DropBefore, DropAfter, Delay, Unavailable, TooManyRequests and
	// InProgress are the probabilities of the faults of the same names.
	DropBefore, DropAfter, Delay, Unavailable, TooManyRequests, InProgress float64
}

// rates lists the probabilities in the order of the Fault constants,
// starting at DropBefore.
func (r FaultRates) rates() [numFaults - 1]float64 {
	return [...]float64{r.DropBefore, r.DropAfter, r.Delay, r.Unavailable, r.TooManyRequests, r.InProgress}
}

func (r FaultRates) validate() error {
	sum := 0.0
	for i, p := range r.rates() {
		if !(p >= 0 && p <= 1) { // also rejects NaN
			return fmt.Errorf("fault rate for %v is %v, want a probability in [0, 1]", Fault(i+1), p)
		}
		sum += p
	}
	if sum > 1+1e-9 {
		return errors.New("fault rates sum to more than 1")
	}
	return nil
}

// pick draws the fault for the attempt-th request with key.
func (r FaultRates) pick(key string, attempt int) Fault {
	rates := r.rates()
	if rates == ([len(rates)]float64{}) {
		return NoFault
	}
	u := float64(draw(r.Seed, key, attempt)>>11) / (1 << 53) // uniform in [0, 1)
	for i, p := range rates {
		if u < p {
			return Fault(i + 1)
		}
		u -= p
	}
	return NoFault
}

// draw returns 64 pseudo-random bits determined by seed, key and attempt.
func draw(seed uint64, key string, attempt int) uint64 {
	h := uint64(14695981039346656037) // FNV-1a offset basis
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= 1099511628211
	}
	return splitmix64(splitmix64(seed^h) + uint64(attempt))
}

// splitmix64 is the finaliser of SplitMix64 (Steele, Lea, Flood 2014), a
// bijective mixer with good avalanche.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
