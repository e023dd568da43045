package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/idemgo/idem/idemtest"
)

// sandboxHosts are the API hosts of providers' test environments that
// idem check accepts without --i-know-this-is-live: a host equal to one,
// or, for an entry starting with "*.", below it. A host with "sandbox" or
// "test" somewhere in its name is no sandbox by that alone
// (test.evil-live-payments.com is anyone's).
var sandboxHosts = []string{
	"api-m.sandbox.paypal.com", "api.sandbox.paypal.com", // PayPal
	"checkout-test.adyen.com", "pal-test.adyen.com", "management-test.adyen.com", "balanceplatform-api-test.adyen.com", // Adyen
	"api.sandbox.checkout.com", "*.api.sandbox.checkout.com", // Checkout.com
	"payment.preprod.direct.worldline-solutions.com", "payment.preprod.direct.ingenico.com", // Worldline
	"connect.squareupsandbox.com",                                                               // Square
	"api.sandbox.braintreegateway.com",                                                          // Braintree
	"api-sandbox.gocardless.com",                                                                // GoCardless
	"apitest.authorize.net",                                                                     // Authorize.net
	"api.playground.klarna.com", "api-na.playground.klarna.com", "api-oc.playground.klarna.com", // Klarna
	"sandbox.plaid.com",             // Plaid
	"api.sandbox.transferwise.tech", // Wise
	"api-sandbox.dwolla.com",        // Dwolla
	"sandboxapi.rapyd.net",          // Rapyd
	"api-demo.airwallex.com",        // Airwallex
	"api.sandbox.mangopay.com",      // Mangopay
	"sandbox.lithic.com",            // Lithic
	"sandbox.increase.com",          // Increase
}

// sandboxPaths are hosts whose test environment is a path on the live
// host: Amazon Pay's sandbox is /sandbox/ on its API hosts.
var sandboxPaths = map[string]string{
	"pay-api.amazon.com": "/sandbox/", "pay-api.amazon.eu": "/sandbox/", "pay-api.amazon.jp": "/sandbox/",
}

// metadataHosts are the names of cloud instance metadata services: never
// a payment API, always a way to reach the machine's credentials.
var metadataHosts = map[string]bool{
	"metadata.google.internal": true, "metadata": true, "metadata.azure.com": true,
	"instance-data": true, "instance-data.ec2.internal": true,
}

// metadataAddrs are instance metadata addresses outside the link-local
// ranges: AWS's IPv6 one (a unique local address) and Alibaba Cloud's.
var metadataAddrs = []netip.Addr{netip.MustParseAddr("fd00:ec2::254"), netip.MustParseAddr("100.100.100.200")}

// forbiddenAddr says why idem check never sends to ip, or "": link-local
// addresses (169.254.0.0/16, fe80::/10, where 169.254.169.254 answers a
// cloud machine's metadata and credentials), metadata addresses,
// unspecified and multicast ones.
func forbiddenAddr(ip netip.Addr) string {
	ip = ip.Unmap()
	switch {
	case ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast():
		return fmt.Sprintf("%s is a link-local address (the cloud metadata service's range)", ip)
	case ip.IsUnspecified() || ip.IsMulticast():
		return fmt.Sprintf("%s is not an address of one server", ip)
	}
	for _, m := range metadataAddrs {
		if ip == m {
			return fmt.Sprintf("%s is a cloud metadata address", ip)
		}
	}
	return ""
}

// forbiddenHost says why idem check never sends to u, even with
// --i-know-this-is-live, or "".
func forbiddenHost(u *url.URL) string {
	host := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	if ip, err := netip.ParseAddr(host); err == nil {
		return forbiddenAddr(ip)
	}
	if metadataHosts[host] {
		return host + " is a cloud metadata service"
	}
	return ""
}

// looksLikeSandbox reports whether u points at a test environment: a
// loopback or private address (RFC 1918, RFC 4193), localhost, or a host
// (and, for Amazon Pay, a path) of sandboxHosts.
func looksLikeSandbox(u *url.URL) bool {
	if forbiddenHost(u) != "" {
		return false
	}
	host := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip.Unmap().IsLoopback() || ip.Unmap().IsPrivate()
	}
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	for _, s := range sandboxHosts {
		if sub, ok := strings.CutPrefix(s, "*."); ok {
			if strings.HasSuffix(host, "."+sub) {
				return true
			}
		} else if host == s {
			return true
		}
	}
	if p, ok := sandboxPaths[host]; ok {
		return strings.HasPrefix(u.EscapedPath(), p)
	}
	return false
}

// checkClient is the client idem check sends with: no redirects followed
// (as idemtest's own), and no connection to a forbidden address, whatever
// the name resolved to.
func checkClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = idemtest.MaxCheckConcurrency
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return nil
		}
		if why := forbiddenAddr(ap.Addr()); why != "" {
			return fmt.Errorf("idem check does not connect to %s: %s", address, why)
		}
		return nil
	}}
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		return d.DialContext(ctx, network, addr)
	}
	return &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}
