package idem

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// This file reads a provider's dialect: what a failed answer's status,
// headers and first body bytes say about the key. Its functions take the
// bytes a peek already read (Provider.classify's, or any other bounded
// peek) and never read a body themselves.

// reading is what a provider's dialect says about one answer.
type reading struct {
	v      verdict
	reason string
	// resource is, for a performed answer, the id of the resource the
	// server made under the key (GoCardless's conflicting_resource_id),
	// or "".
	resource string
}

// read returns what p's dialect says about a failed answer (a status of
// 400 or more) with header h whose body begins with peek; ok is false
// when p says nothing about it. Retry hints come first (Stripe-Should-Retry,
// Adyen's transient-error); then, for a 4xx, p's codes in the body: a
// performed code (the request was performed, its answer is not replayed),
// an in-progress code, a key-reused code. A code is matched as a whole
// JSON string, wherever the provider puts it (code, errorCode, type,
// errors[].reason, ...).
func (p *Provider) read(code int, h http.Header, peek []byte) (reading, bool) {
	for _, name := range p.RetryHints {
		switch strings.ToLower(strings.TrimSpace(h.Get(name))) {
		case "true":
			r := reading{v: transient, reason: strconv.Itoa(code) + " " + http.CanonicalHeaderKey(name) + ": true"}
			if k, ok := p.code(p.InProgressCodes, peek); ok && code < 500 {
				r.v, r.reason = inProgress, r.reason+" in progress ("+k+")"
			}
			return r, true
		case "false":
			return reading{v: permanent, reason: strconv.Itoa(code) + " " + http.CanonicalHeaderKey(name) + ": false"}, true
		}
	}
	if code >= 500 {
		return reading{}, false
	}
	if k, ok := p.code(p.PerformedCodes, peek); ok {
		return reading{v: performed, reason: strconv.Itoa(code) + " performed, answer not kept (" + k + ")",
			resource: jsonString(peek, p.ResourceField)}, true
	}
	// An in-progress code is the more specific: Stripe's in-progress
	// error carries idempotency_key_in_use with a type that may read
	// idempotency_error, its key-reused code.
	if k, ok := p.code(p.InProgressCodes, peek); ok {
		return reading{v: inProgress, reason: strconv.Itoa(code) + " in progress (" + k + ")"}, true
	}
	if k, ok := p.code(p.KeyReusedCodes, peek); ok {
		return reading{v: permanent, reason: strconv.Itoa(code) + " key reused (" + k + ")"}, true
	}
	return reading{}, false
}

// code returns the first of codes that peek holds as a whole JSON string.
func (p *Provider) code(codes []string, peek []byte) (string, bool) {
	for _, k := range codes {
		if k != "" && bytes.Contains(peek, []byte(`"`+k+`"`)) {
			return k, true
		}
	}
	return "", false
}

// jsonString returns the string value of the first JSON member called
// name in b (at any depth, in a body that may be cut short), or "" when
// there is none, name is "", or its value is not a plain string of at most
// 255 visible ASCII bytes (an id, not a text to be trusted).
func jsonString(b []byte, name string) string {
	if name == "" {
		return ""
	}
	needle := []byte(`"` + name + `"`)
	for {
		i := bytes.Index(b, needle)
		if i < 0 {
			return ""
		}
		b = b[i+len(needle):]
		rest := bytes.TrimLeft(b, " \t\r\n")
		if len(rest) == 0 || rest[0] != ':' {
			continue // the name as a value, not a member
		}
		rest = bytes.TrimLeft(rest[1:], " \t\r\n")
		if len(rest) == 0 || rest[0] != '"' {
			return ""
		}
		end := bytes.IndexByte(rest[1:], '"')
		if end < 0 || end > maxKeyLen {
			return ""
		}
		v := rest[1 : 1+end]
		for _, c := range v {
			if c < 0x21 || c > 0x7e || c == '\\' {
				return ""
			}
		}
		return string(v)
	}
}

// PerformedHeader is the response header idem sets on an answer that says
// the server performed the request under its key and does not replay the
// answer: idemserver's 409 ProblemNotKept, GoCardless's 409
// idempotent_creation_conflict (Provider.PerformedCodes). Its value lists
// what the server said, as PerformedOf reads it: "original-status=201",
// "resource=PM123", both, or "unknown". idem removes a header of this name
// that the server sent on any other answer. The journal records the same
// facts (see Outcome.Err).
const PerformedHeader = "Idem-Performed"

// Performed is what an answer said about a request the server performed
// without replaying its answer.
type Performed struct {
	// Status is the status the server first answered with, or 0 when it
	// did not say.
	Status int
	// Resource is the id of the resource the server made under the key
	// (GoCardless's links.conflicting_resource_id), or "": fetch it to
	// learn the outcome.
	Resource string
}

// PerformedOf reports whether resp, a response from a Client, says that
// the server performed the request under its key without replaying its
// answer, and what it said about it. Such a call is finished in the
// journal (succeeded when the server made a resource or first answered
// with a 2xx or 3xx), and is never sent again.
func PerformedOf(resp *http.Response) (Performed, bool) {
	if resp == nil {
		return Performed{}, false
	}
	v, ok := resp.Header[PerformedHeader]
	if !ok || len(v) == 0 {
		return Performed{}, false
	}
	var p Performed
	for _, f := range strings.Split(v[0], ",") {
		k, val, _ := strings.Cut(strings.TrimSpace(f), "=")
		switch k {
		case "original-status":
			p.Status, _ = strconv.Atoi(val)
		case "resource":
			p.Resource = val
		}
	}
	return p, true
}

// String returns p as PerformedHeader carries it.
func (p Performed) String() string {
	var parts []string
	if p.Status != 0 {
		parts = append(parts, "original-status="+strconv.Itoa(p.Status))
	}
	if p.Resource != "" {
		parts = append(parts, "resource="+p.Resource)
	}
	if len(parts) == 0 {
		return "unknown"
	}
	return strings.Join(parts, ", ")
}

// bodyKey returns the string value of body's top-level member field and
// whether it has one, or an error if body is not a JSON object (or the
// member is not a string).
func bodyKey(body []byte, field string) (string, bool, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil || obj == nil {
		return "", false, fmt.Errorf("the key travels in the JSON body's %s member, and the body is not a JSON object", quote(field))
	}
	raw, ok := obj[field]
	if !ok {
		return "", false, nil
	}
	var k string
	if err := json.Unmarshal(raw, &k); err != nil {
		return "", false, fmt.Errorf("the body's %s member is not a string", quote(field))
	}
	return k, true, nil
}

// withBodyKey returns a copy of body, a JSON object without member field,
// with "field":key as its first member.
func withBodyKey(body []byte, field, key string) []byte {
	i := bytes.IndexByte(body, '{') // bodyKey made sure it is an object
	member, _ := json.Marshal(map[string]string{field: key})
	member = member[1 : len(member)-1] // "field":"key"
	out := make([]byte, 0, len(body)+len(member)+1)
	out = append(out, body[:i+1]...)
	out = append(out, member...)
	if rest := bytes.TrimLeft(body[i+1:], " \t\r\n"); len(rest) > 0 && rest[0] != '}' {
		out = append(out, ',')
	}
	return append(out, body[i+1:]...)
}

// InProgress reports whether p reads an answer with status, header h and
// body (its first bytes) as "a request under this key is still being
// processed": for tools, such as idem check, that judge answers as the
// Client would.
func (p Provider) InProgress(status int, h http.Header, body []byte) bool {
	r, ok := p.read(status, h, body)
	return ok && r.v == inProgress
}

// PerformedAnswer reports whether p reads an answer with status, header h
// and body (its first bytes) as "a request under this key was performed,
// its answer is not replayed" (Provider.PerformedCodes), and the resource
// it names.
func (p Provider) PerformedAnswer(status int, h http.Header, body []byte) (Performed, bool) {
	r, ok := p.read(status, h, body)
	if !ok || r.v != performed {
		return Performed{}, false
	}
	return Performed{Resource: r.resource}, true
}
