package idem

import "sync"

// retryBudget is a token bucket per host that bounds retries to a share of
// requests: every call adds ratio tokens (up to burst) and every retry takes
// one. During an outage retries then add at most about ratio to the request
// rate, instead of multiplying it by the number of attempts.
type retryBudget struct {
	ratio, burst float64

	mu     sync.Mutex
	tokens map[string]float64 // by host; a host starts with a full bucket
}

func newRetryBudget(ratio float64, burst int) *retryBudget {
	return &retryBudget{ratio: ratio, burst: float64(burst), tokens: make(map[string]float64)}
}

// level returns host's tokens; b.mu is held.
func (b *retryBudget) level(host string) float64 {
	t, ok := b.tokens[host]
	if !ok {
		return b.burst
	}
	return t
}

// deposit credits one call to host.
func (b *retryBudget) deposit(host string) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tokens[host] = min(b.burst, b.level(host)+b.ratio)
}

// withdraw takes a token for one retry to host and reports whether there
// was one.
func (b *retryBudget) withdraw(host string) bool {
	if b == nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.level(host)
	if t < 1 {
		return false
	}
	b.tokens[host] = t - 1
	return true
}
