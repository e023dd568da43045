// Package keys holds the rule for an idempotency key, shared by the root
// package (which checks every key before it journals it) and package
// idemstore (CheckKey, for store authors), and the context key of
// idem.WithKey, which idemserver's Step sets without importing the client.
package keys

import "fmt"

// MaxLen bounds a key, in bytes.
const MaxLen = 255

// Check returns an error unless k is 1 to MaxLen bytes of visible ASCII:
// a key that can be sent as a header value and stored.
func Check(k string) error {
	if k == "" || len(k) > MaxLen {
		return fmt.Errorf("key must be 1 to %d bytes, got %d", MaxLen, len(k))
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return fmt.Errorf("key has a byte 0x%02x at offset %d that is not visible ASCII", k[i], i)
		}
	}
	return nil
}

// Context is the context key of the key idem.WithKey gives a context's
// requests; its value is a string.
type Context struct{}
