package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemtest"
)

var checkUsage = fmt.Sprintf(`usage: idem check [-X METHOD] [-H 'Name: value']... -d BODY [--other-body BODY]
                 [--key-header NAME | --provider NAME] [--wait-retention D] [--json]
                 [--i-know-this-is-live] URL

Asks one endpoint of a sandbox whether it really honours idempotency keys,
by running the test plan for idempotent APIs against it and judging only
from its answers:

  replay          the same request twice with one key: the second answer
                  must repeat the first's status and body (a control
                  operation with another key must be answered differently)
  other-payload   another body under the used key must not get a 2xx
  concurrent      %d requests with one key at once (--concurrency): at most
                  one performs, the others get 409 or its replay
  cut-connection  a request cut right after it was written, then retried
                  with its key: answered, and a further retry repeats it
  replay-marker   a header marks the replay (informational)
  retention       with --wait-retention D only: resent D later, the key
                  must still be honoured

Every logical operation gets its own key, and "{{uuid}}" in a body is
replaced by a fresh UUID per operation, so repeated runs do not collide.

It sends at most %d requests, each bounded by --timeout. Against a server
that honours keys they perform about 7 operations (test charges on the
sandbox); a server that ignores keys performs one per request.

It refuses a URL that is not a known sandbox (a loopback or private
address, localhost, or a provider's sandbox host: api-m.sandbox.paypal.com,
checkout-test.adyen.com, api.sandbox.checkout.com, Amazon Pay's /sandbox/
paths and others) unless --i-know-this-is-live is given. Stripe's test
mode shares the live host api.stripe.com: check the key is sk_test_
before giving the flag. It never sends to a link-local address
(169.254.169.254, where a cloud machine's credentials are served) or
another cloud metadata address or name, flag or not, whatever a name
resolves to.

Flags:
  -X METHOD               request method (default POST)
  -H 'Name: value'        request header, repeatable (credentials, Content-Type)
  -d BODY                 request body; @FILE reads it from FILE. Without a
                          Content-Type header, one is sent: application/json
                          for a body starting with { or [, else a form
  --other-body BODY       the other payload (default: BODY with fresh UUIDs,
                          if it has {{uuid}})
  --key-header NAME       the key's header (default Idempotency-Key)
  --provider NAME         take header (or body member), key format and the
                          in-progress and performed answers from a profile:
                          %s
  --concurrency N         requests at once in the concurrent scenario (2 to %d)
  --wait-retention D      add the retention scenario (e.g. 10m)
  --timeout D             bound on each request (default 30s)
  --json                  print the report as JSON
  --i-know-this-is-live   allow a URL that does not look like a sandbox

Exit status: 0 every scenario conforms, 1 any does not (or cannot be
judged), 2 usage.
`, idemtest.DefaultCheckConcurrency, idemtest.MaxCheckRequests, strings.Join(providerNames(), ", "), idemtest.MaxCheckConcurrency)

// checkProviders are the profiles --provider names.
var checkProviders = map[string]idem.Provider{
	"stripe": idem.Stripe, "stripev2": idem.StripeV2, "paypal": idem.PayPal, "paypalorders": idem.PayPalOrders,
	"paypalvault": idem.PayPalVault, "paypalsubscriptions": idem.PayPalSubscriptions,
	"paypalpaymentsv1": idem.PayPalPaymentsV1, "paypalpaymentsv2": idem.PayPalPaymentsV2,
	"adyen": idem.Adyen, "gocardless": idem.GoCardless, "square": idem.Square,
	"checkoutcom": idem.CheckoutCom, "worldline": idem.Worldline, "amazonpay": idem.AmazonPay,
}

func providerNames() []string {
	var names []string
	for n := range checkProviders {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// headerFlags collects repeated -H flags.
type headerFlags []string

func (h *headerFlags) String() string     { return strings.Join(*h, ", ") }
func (h *headerFlags) Set(v string) error { *h = append(*h, v); return nil }

// checkCmd runs "idem check" with args (those after "check") and returns
// the exit status.
func checkCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	usage := func(msg string) int {
		fmt.Fprintf(stderr, "idem check: %s\n(idem check -h for help)\n", msg)
		return exitUsage
	}
	fs := flag.NewFlagSet("idem check", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var (
		headers   headerFlags
		method    = fs.String("X", http.MethodPost, "")
		body      = fs.String("d", "", "")
		other     = fs.String("other-body", "", "")
		keyHeader = fs.String("key-header", "", "")
		provider  = fs.String("provider", "", "")
		n         = fs.Int("concurrency", idemtest.DefaultCheckConcurrency, "")
		wait      = fs.Duration("wait-retention", 0, "")
		timeout   = fs.Duration("timeout", idemtest.DefaultCheckTimeout, "")
		asJSON    = fs.Bool("json", false, "")
		live      = fs.Bool("i-know-this-is-live", false, "")
		bodySet   bool
	)
	fs.Var(&headers, "H", "")
	// Flags may come after the URL, as with curl.
	var pos []string
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprint(stdout, checkUsage)
				return exitOK
			}
			return usage(err.Error())
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	fs.Visit(func(f *flag.Flag) { bodySet = bodySet || f.Name == "d" })
	switch {
	case len(pos) != 1:
		return usage(fmt.Sprintf("want one URL, got %d arguments", len(pos)))
	case !bodySet:
		return usage("no body: give -d BODY (-d '' for an empty one)")
	case *n < 2 || *n > idemtest.MaxCheckConcurrency:
		return usage(fmt.Sprintf("--concurrency must be 2 to %d", idemtest.MaxCheckConcurrency))
	case *wait < 0 || *timeout <= 0:
		return usage("--wait-retention and --timeout must be positive")
	}
	u, err := url.Parse(pos[0])
	if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return usage(fmt.Sprintf("%q is not an http or https URL", pos[0]))
	}
	if why := forbiddenHost(u); why != "" {
		return usage(fmt.Sprintf("%s: idem check never sends there, --i-know-this-is-live or not", why))
	}
	if !*live && !looksLikeSandbox(u) {
		return usage(fmt.Sprintf("%s is not a known sandbox (a loopback or private address, localhost, or a provider's sandbox host such as api-m.sandbox.paypal.com): "+
			"this check performs real operations; give --i-know-this-is-live if it is a test environment anyway", u.Host))
	}
	cfg := idemtest.CheckConfig{
		URL: u.String(), Method: *method, Header: http.Header{}, KeyHeader: *keyHeader,
		Concurrency: *n, WaitRetention: *wait, Timeout: *timeout, Client: checkClient(),
	}
	for _, h := range headers {
		name, value, ok := strings.Cut(h, ":")
		if !ok || strings.TrimSpace(name) == "" {
			return usage(fmt.Sprintf("-H %q is not 'Name: value'", h))
		}
		if why := unsendableHeader(strings.TrimSpace(name), strings.TrimSpace(value)); why != "" {
			return usage(fmt.Sprintf("-H %q cannot be sent: %s", h, why))
		}
		cfg.Header.Add(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	if cfg.Body, err = readBodyFlag(*body); err != nil {
		return usage(err.Error())
	}
	if cfg.OtherBody, err = readBodyFlag(*other); err != nil {
		return usage(err.Error())
	}
	if cfg.Header.Get("Content-Type") == "" && cfg.Body != "" {
		cfg.Header.Set("Content-Type", bodyType(cfg.Body))
	}
	if *provider != "" {
		p, ok := checkProviders[strings.ToLower(*provider)]
		if !ok {
			return usage(fmt.Sprintf("unknown provider %q (know: %s)", *provider, strings.Join(providerNames(), ", ")))
		}
		if cfg.KeyHeader == "" {
			cfg.KeyHeader = p.Header
		}
		cfg.NewKey = func() string { k, _ := p.NewKey(); return k }
		// The profile's rules: where the key travels, and which answers
		// mean "in progress" or "performed, not replayed".
		cfg.BodyKeyField = p.BodyKeyField
		cfg.Busy = p.InProgress
		cfg.Performed = func(status int, h http.Header, body []byte) bool {
			_, ok := p.PerformedAnswer(status, h, body)
			return ok
		}
	}

	rep, err := idemtest.Check(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "idem check: %v\n", err)
		return exitFailed
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintf(stderr, "idem check: %v\n", err)
			return exitFailed
		}
	} else {
		printCheck(stdout, rep)
	}
	if !rep.Conforms {
		return exitFailed
	}
	return exitOK
}

// readBodyFlag returns a body flag's value, or the file it names after @.
func readBodyFlag(v string) (string, error) {
	if !strings.HasPrefix(v, "@") {
		return v, nil
	}
	b, err := os.ReadFile(v[1:])
	if err != nil {
		return "", fmt.Errorf("reading body: %w", err)
	}
	return string(b), nil
}

// bodyType is the Content-Type for a body given without one: JSON for a
// body that starts like JSON, else a form, as curl -d sends.
func bodyType(b string) string {
	if t := strings.TrimSpace(b); strings.HasPrefix(t, "{") || strings.HasPrefix(t, "[") {
		return "application/json"
	}
	return "application/x-www-form-urlencoded"
}

// printCheck prints the report as a table and a summary line.
func printCheck(w io.Writer, rep idemtest.CheckReport) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tSENT\tCAME BACK\tVERDICT\tWHY")
	for _, r := range rep.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Scenario, r.Sent, r.Got, r.Verdict, r.Why)
	}
	tw.Flush()
	verdict := "conforms"
	if !rep.Conforms {
		verdict = "does NOT conform"
		if f := rep.Failed(); len(f) > 0 {
			verdict += " (failed: " + strings.Join(f, ", ") + ")"
		} else {
			verdict += " (some scenarios could not be judged)"
		}
	}
	fmt.Fprintf(w, "\n%s %s: %s; %d requests sent\n", rep.Method, rep.URL, verdict, rep.Requests)
}

// unsendableHeader says why net/http would refuse to send a header, or "".
func unsendableHeader(name, value string) string {
	for i := 0; i < len(name); i++ {
		if b := name[i]; b <= ' ' || b >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, b) >= 0 {
			return fmt.Sprintf("the name has %q, which is not allowed in a header name", b)
		}
	}
	for i := 0; i < len(value); i++ {
		if b := value[i]; b < ' ' && b != '\t' || b == 0x7f {
			return fmt.Sprintf("the value has the control byte 0x%02x", b)
		}
	}
	return ""
}
