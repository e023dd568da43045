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
// are ignored. A bare key must be visible ASCII (0x21 to 0x7E) without a
// comma: in a structured field a comma separates list members, so
// "a,b" is two keys, not one. A quoted key may also hold spaces and may
// be followed by RFC 8941 parameters (";v=1"), which are checked and
// ignored. The key is 1 to MaxKeyBytes bytes after unquoting.
func ParseKey(v string) (string, error) {
	v = strings.Trim(v, " \t")
	key := v
	if strings.HasPrefix(v, `"`) {
		var (
			rest string
			err  error
		)
		if key, rest, err = unquote(v); err != nil {
			return "", err
		}
		if err := checkParams(rest); err != nil {
			return "", err
		}
	} else {
		for i := 0; i < len(v); i++ {
			if c := v[i]; c < 0x21 || c > 0x7e {
				return "", fmt.Errorf("%w: byte %#02x at %d is not visible ASCII", ErrInvalidKey, c, i)
			}
			if v[i] == ',' {
				return "", fmt.Errorf("%w: a comma separates list members; one key is expected", ErrInvalidKey)
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

// unquote decodes the sf-string v starts with and returns it and the text
// after its closing quote; v starts with a double quote.
func unquote(v string) (key, rest string, err error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", "", fmt.Errorf("%w: bad escape in quoted key", ErrInvalidKey)
			}
			b.WriteByte(v[i])
		case c == '"':
			return b.String(), v[i+1:], nil
		case c < 0x20 || c > 0x7e:
			return "", "", fmt.Errorf("%w: byte %#02x at %d is not printable ASCII", ErrInvalidKey, c, i)
		default:
			b.WriteByte(c)
		}
	}
	return "", "", fmt.Errorf("%w: missing closing quote", ErrInvalidKey)
}

// checkParams checks that s is a list of RFC 8941 parameters (§3.1.2):
// each ";" then spaces, a key (lcalpha or "*", then lcalpha, digits,
// "_", "-", ".", "*"), and optionally "=" and a bare item. Anything else
// after a quoted key, a comma above all, is an error.
func checkParams(s string) error {
	for s != "" {
		if s[0] != ';' {
			if s[0] == ',' {
				return fmt.Errorf("%w: a comma separates list members; one key is expected", ErrInvalidKey)
			}
			return fmt.Errorf("%w: text after the closing quote", ErrInvalidKey)
		}
		s = strings.TrimLeft(s[1:], " ")
		n := 0
		for n < len(s) && (s[n] >= 'a' && s[n] <= 'z' || s[n] == '*' ||
			n > 0 && (s[n] >= '0' && s[n] <= '9' || strings.IndexByte("_-.", s[n]) >= 0)) {
			n++
		}
		if n == 0 {
			return fmt.Errorf("%w: bad parameter after the key", ErrInvalidKey)
		}
		s = s[n:]
		if s == "" || s[0] != '=' {
			continue
		}
		var err error
		if s, err = skipBareItem(s[1:]); err != nil {
			return err
		}
	}
	return nil
}

// skipBareItem returns s after the RFC 8941 bare item it starts with: a
// string, a token, a number, a boolean or a byte sequence.
func skipBareItem(s string) (string, error) {
	bad := fmt.Errorf("%w: bad parameter value after the key", ErrInvalidKey)
	if s == "" {
		return "", bad
	}
	end := func(ok func(c byte) bool) string {
		i := 0
		for i < len(s) && ok(s[i]) {
			i++
		}
		return s[i:]
	}
	switch c := s[0]; {
	case c == '"':
		_, rest, err := unquote(s)
		if err != nil {
			return "", bad
		}
		return rest, nil
	case c == '?':
		if len(s) < 2 || (s[1] != '0' && s[1] != '1') {
			return "", bad
		}
		return s[2:], nil
	case c == ':':
		rest := s[1:]
		i := strings.IndexByte(rest, ':')
		if i < 0 || strings.Trim(rest[:i], "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=") != "" {
			return "", bad
		}
		return rest[i+1:], nil
	case c == '-' || c >= '0' && c <= '9':
		s = s[1:]
		return end(func(c byte) bool { return c >= '0' && c <= '9' || c == '.' }), nil
	case c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c == '*':
		return end(func(c byte) bool {
			return c > 0x20 && c < 0x7f && strings.IndexByte(`"(),;<=>?@[\]{}`, c) < 0
		}), nil
	}
	return "", bad
}
