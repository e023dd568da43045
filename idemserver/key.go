package idemserver

import (
	"errors"
	"fmt"
	"strings"
)

// MaxKeyBytes is the longest key ParseKey accepts, counted after unquoting.
const MaxKeyBytes = 255

// ErrInvalidKey is returned, wrapped, by ParseKey for a key that is empty,
// longer than MaxKeyBytes, not printable ASCII, or a malformed quoted
// string. The middleware answers such a key with 400 Bad Request.
var ErrInvalidKey = errors.New("idemserver: invalid idempotency key")

// ParseKey returns the key in one Idempotency-Key header value. It accepts
// the key bare (abc-123) and in the structured-field string form of
// draft-ietf-httpapi-idempotency-key-header ("abc-123", RFC 8941 §3.3.3,
// where \" and \\ are the only escapes). Spaces and tabs around the value
// are ignored. A bare key must be visible ASCII (0x21 to 0x7E); a quoted
// one may also hold spaces. The key is 1 to MaxKeyBytes bytes after
// unquoting.
func ParseKey(v string) (string, error) {
	v = strings.Trim(v, " \t")
	key := v
	if strings.HasPrefix(v, `"`) {
		var err error
		if key, err = unquote(v); err != nil {
			return "", err
		}
	} else {
		for i := 0; i < len(v); i++ {
			if c := v[i]; c < 0x21 || c > 0x7e {
				return "", fmt.Errorf("%w: byte %#02x at %d is not visible ASCII", ErrInvalidKey, c, i)
			}
		}
	}
	switch {
	case key == "":
		return "", fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > MaxKeyBytes:
		return "", fmt.Errorf("%w: %d bytes, at most %d allowed", ErrInvalidKey, len(key), MaxKeyBytes)
	}
	return key, nil
}

// unquote decodes an sf-string; v starts with a double quote.
func unquote(v string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", fmt.Errorf("%w: bad escape in quoted key", ErrInvalidKey)
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", fmt.Errorf("%w: text after the closing quote", ErrInvalidKey)
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("%w: byte %#02x at %d is not printable ASCII", ErrInvalidKey, c, i)
		default:
			b.WriteByte(c)
		}
	}
	return "", fmt.Errorf("%w: missing closing quote", ErrInvalidKey)
}
