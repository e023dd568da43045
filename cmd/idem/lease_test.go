package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestKeyBefore: no key of visible ASCII (idem.CheckKey) sorts between
// keyBefore(k) and k, so that take's Claim from it meets k first.
func TestKeyBefore(t *testing.T) {
	for _, k := range []string{"!", "a", "a!", "01a23130-f108-76dc-a7a2-9dfa5933314e", "k~", strings.Repeat("~", 255)} {
		b := keyBefore(k)
		assert.Less(t, b, k, "%q", k)
		last := k[len(k)-1]
		// The keys closest below k: its prefix, and the prefix with its
		// last byte lowered then filled with '~' to the longest key.
		closest := []string{k[:len(k)-1]}
		if last > '!' {
			closest = append(closest, k[:len(k)-1]+string(last-1)+strings.Repeat("~", 255-len(k)))
		}
		for _, c := range closest {
			if c != "" {
				assert.LessOrEqual(t, c, b, "%q sorts between keyBefore(%q) and it", c, k)
			}
		}
	}
}
