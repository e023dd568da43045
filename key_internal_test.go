package idem

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

// TestNewKeyIsUUIDv7 checks the keys idem makes: canonical UUIDv7 text,
// RFC 9562 variant, dated now, strictly increasing in the order they were
// made, random in their last 62 bits, one allocation each.
func TestNewKeyIsUUIDv7(t *testing.T) {
	before := time.Now()
	const n = 2000
	keys := make([]string, n)
	for i := range keys {
		k, err := newKey()
		if err != nil {
			t.Fatal(err)
		}
		keys[i] = k
	}
	after := time.Now()
	seen := make(map[string]bool, n)
	for i, k := range keys {
		u, err := uuid.Parse(k)
		if err != nil {
			t.Fatalf("key %q: %v", k, err)
		}
		if u.String() != k {
			t.Fatalf("key %q is not in canonical form (%q)", k, u.String())
		}
		if u.Version() != 7 || u.Variant() != uuid.RFC4122 {
			t.Fatalf("key %q: version %d, variant %v; want 7, RFC 4122", k, u.Version(), u.Variant())
		}
		sec, nsec := u.Time().UnixTime()
		at := time.Unix(sec, nsec)
		if at.Before(before.Truncate(time.Millisecond)) || at.After(after.Add(time.Second)) {
			t.Fatalf("key %q is dated %v, not between %v and %v", k, at, before, after)
		}
		if i > 0 && strings.Compare(keys[i-1], k) >= 0 {
			t.Fatalf("key %d %q does not sort after key %d %q", i, k, i-1, keys[i-1])
		}
		if seen[k[19:]] {
			t.Fatalf("random part of key %q repeats", k)
		}
		seen[k[19:]] = true
	}
	if raceEnabled {
		return
	}
	if a := testing.AllocsPerRun(100, func() { newKey() }); a != 1 {
		t.Errorf("newKey allocates %v times, want 1 (its string)", a)
	}
}
