package idem

import (
	"net/http"
	"net/url"
	"strings"
)

// This file owns redaction: which request headers and URL query
// parameters are secrets, and how a URL, a header or an error text is
// shown without them. The journal (journaledURL, journaledHeader), the
// resend match key (matchKey's credentials), recorded and returned error
// texts and the log lines that carry them (errText), the redirect policy,
// and, through the exported functions, the otel package (url.full, span
// status), the idem command (show) and the live page (recent errors) all
// use this one list.

// defaultSecretHeaders are the request headers never journaled, never
// forwarded on a redirect to another host, and shown as REDACTED.
var defaultSecretHeaders = []string{
	"Authorization", "Proxy-Authorization", "Cookie",
	"X-Api-Key", "Api-Key", "X-Auth-Token", "X-Amz-Security-Token",
}

// defaultSecretQuery are the URL query parameters never journaled and
// shown as REDACTED, matched without regard to case: idem's own, the
// usual token names, those OpenTelemetry's conventions name for url.full
// (AWSAccessKeyId, Signature, X-Goog-Signature) and the credentials of
// AWS SigV4 and Google V4 presigned URLs.
var defaultSecretQuery = []string{
	"api_key", "apikey", "api-key", "key", "secret", "client_secret", "password", "passwd",
	"token", "access_token", "refresh_token", "id_token", "auth", "auth_token", "session_token",
	"signature", "sig",
	"AWSAccessKeyId", "X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token",
	"X-Goog-Signature", "X-Goog-Credential",
}

// DefaultSecretHeaders returns, in a new slice, the request headers idem
// treats as secrets unless told of more (WithSecretHeaders): never
// journaled, stripped from a request redirected to another host, part of
// the credentials that tell callers apart for resend matching, and shown
// as REDACTED by RedactHeader.
func DefaultSecretHeaders() []string { return append([]string(nil), defaultSecretHeaders...) }

// DefaultSecretQueryParams returns, in a new slice, the URL query
// parameters idem treats as secrets unless told of more
// (WithSecretQueryParams), matched without regard to case: never
// journaled, and shown as REDACTED by RedactURL.
func DefaultSecretQueryParams() []string { return append([]string(nil), defaultSecretQuery...) }

// secrets is the default list, for the exported functions.
var secrets = func() config {
	var c config
	c.secret, c.secretQuery = defaultSecrets()
	return c
}()

// defaultSecrets returns the sets of default secret headers (canonical)
// and query parameters (lower case).
func defaultSecrets() (headers, query map[string]bool) {
	headers = make(map[string]bool, len(defaultSecretHeaders))
	for _, h := range defaultSecretHeaders {
		headers[http.CanonicalHeaderKey(h)] = true
	}
	query = make(map[string]bool, len(defaultSecretQuery))
	for _, q := range defaultSecretQuery {
		query[strings.ToLower(q)] = true
	}
	return headers, query
}

// WithSecretHeaders adds headers that are never written to the journal
// and are stripped from a request redirected to another host, besides
// DefaultSecretHeaders (Authorization, Proxy-Authorization, Cookie,
// X-Api-Key, Api-Key, X-Auth-Token, X-Amz-Security-Token). Use
// WithResumePrepare to add them back to resumed requests.
func WithSecretHeaders(names ...string) Option {
	return func(c *config) {
		for _, n := range names {
			c.secret[http.CanonicalHeaderKey(n)] = true
		}
	}
}

// WithSecretQueryParams adds URL query parameters, matched without regard
// to case, that are never written to the journal, besides
// DefaultSecretQueryParams (api_key, token, access_token, signature,
// X-Amz-Signature, X-Amz-Credential and the like). Use WithResumePrepare to
// add them back to resumed requests.
func WithSecretQueryParams(names ...string) Option {
	return func(c *config) {
		for _, n := range names {
			c.secretQuery[strings.ToLower(n)] = true
		}
	}
}

// isSecretHeader reports whether the canonical header name ck is a secret.
func (c *config) isSecretHeader(ck string) bool { return c.secret[ck] }

// isSecretQuery reports whether the query parameter name is a secret.
func (c *config) isSecretQuery(name string) bool {
	return c.secretQuery[name] || c.secretQuery[strings.ToLower(name)]
}

// redactedURL returns u without user info and without the secret query
// parameters, as the journal keeps it.
func (c *config) redactedURL(u *url.URL) string {
	v := *u
	v.User = nil
	if v.RawQuery != "" {
		q := v.Query()
		for k := range q {
			if c.isSecretQuery(k) {
				q.Del(k)
			}
		}
		v.RawQuery = q.Encode()
	}
	return v.String()
}

// hasSecretQuery reports whether a raw query names a secret parameter.
func (c *config) hasSecretQuery(raw string) bool {
	for raw != "" {
		var part string
		part, raw, _ = strings.Cut(raw, "&")
		name, _, _ := strings.Cut(part, "=")
		if n, err := url.QueryUnescape(name); err == nil {
			name = n
		}
		if c.isSecretQuery(name) {
			return true
		}
	}
	return false
}

// maskedURL returns raw for display: user info as REDACTED:REDACTED, the
// values of secret query parameters as REDACTED (the rest of the query
// as it was), no fragment. A raw that does not parse is returned as "".
func (c *config) maskedURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	u.Fragment, u.RawFragment = "", ""
	if u.User != nil {
		u.User = url.UserPassword("REDACTED", "REDACTED")
	}
	if u.RawQuery != "" && c.hasSecretQuery(u.RawQuery) {
		parts := strings.Split(u.RawQuery, "&")
		for i, p := range parts {
			name, _, ok := strings.Cut(p, "=")
			if n, err := url.QueryUnescape(name); err == nil {
				name = n
			}
			if ok && c.isSecretQuery(name) {
				parts[i] = p[:strings.IndexByte(p, '=')] + "=REDACTED"
			}
		}
		u.RawQuery = strings.Join(parts, "&")
	}
	return u.String()
}

// redactText returns s with every URL in it (a run of text from a scheme's
// "://" to a space, quote or end) that holds user info or a secret query
// parameter masked as maskedURL does, for error texts: net/http's
// *url.Error quotes the request's URL with its query.
func (c *config) redactText(s string) string {
	if !strings.Contains(s, "://") {
		return s
	}
	var b strings.Builder
	for {
		i := strings.Index(s, "://")
		if i < 0 {
			break
		}
		start := i
		for start > 0 && isSchemeByte(s[start-1]) {
			start--
		}
		end := i + 3
		for end < len(s) && !strings.ContainsRune(" \t\r\n\"'<>`", rune(s[end])) {
			end++
		}
		b.WriteString(s[:start])
		raw := s[start:end]
		if u, err := url.Parse(raw); err == nil && (u.User != nil || c.hasSecretQuery(u.RawQuery)) {
			b.WriteString(c.maskedURL(raw))
		} else {
			b.WriteString(raw) // nothing to hide: the text as it was
		}
		s = s[end:]
	}
	b.WriteString(s)
	return b.String()
}

// errText returns err's text for a log line, its URLs redacted (see
// redactText), or nil for a nil err.
func errText(err error) any {
	if err == nil {
		return nil
	}
	return secrets.redactText(err.Error())
}

// isSchemeByte reports whether c may be in a URL scheme.
func isSchemeByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.'
}

// redirectRequest returns req, a request net/http's client made to follow
// a redirect, without the secret headers when it goes to another host
// (host and port) than the first request of its chain: net/http strips
// only Authorization, Cookie and WWW-Authenticate, and only for another
// domain, so an X-Api-Key would reach wherever a provider, or a proxy
// in between, redirects. The request is copied, not changed.
func (c *config) redirectRequest(req *http.Request) *http.Request {
	first := req
	for first.Response != nil && first.Response.Request != nil {
		first = first.Response.Request
	}
	if strings.EqualFold(first.URL.Host, req.URL.Host) {
		return req
	}
	var out *http.Request
	for k := range req.Header {
		if c.isSecretHeader(http.CanonicalHeaderKey(k)) {
			if out == nil {
				out = req.Clone(req.Context())
			}
			delete(out.Header, k)
		}
	}
	if out == nil {
		return req
	}
	return out
}

// RedactURL returns raw as idem shows a URL: user info as
// REDACTED:REDACTED, the values of DefaultSecretQueryParams and of the
// parameters named in more (matched without regard to case) as REDACTED,
// the rest of the query kept, no fragment; "" for a raw that does not
// parse. The otel package's url.full, the idem command and the live page
// show URLs through it.
func RedactURL(raw string, more ...string) string {
	if len(more) == 0 {
		return secrets.maskedURL(raw)
	}
	var c config
	_, c.secretQuery = defaultSecrets()
	for _, n := range more {
		c.secretQuery[strings.ToLower(n)] = true
	}
	return c.maskedURL(raw)
}

// RedactHeader returns a copy of h with the values of DefaultSecretHeaders
// replaced by REDACTED, for showing a journaled header (a journal written
// by an earlier release may hold one).
func RedactHeader(h http.Header) http.Header {
	if h == nil {
		return nil
	}
	out := make(http.Header, len(h))
	for k, v := range h {
		if secrets.isSecretHeader(http.CanonicalHeaderKey(k)) {
			v = []string{"REDACTED"}
		} else {
			v = append([]string(nil), v...)
		}
		out[k] = v
	}
	return out
}

// RedactText returns s, an error text, with every URL in it shown as
// RedactURL shows it: for an application that logs the errors of
// http.Client.Do, whose *url.Error quotes the request's URL with its query
// as sent.
func RedactText(s string) string { return secrets.redactText(s) }
