package pgstore_test

import (
	"bytes"
	"net"
	"net/url"
	"sync"
	"testing"
)

// proxy is a loopback TCP proxy in front of PostgreSQL that a test can
// break in the ways a network breaks: Down closes every connection and
// refuses new ones, as a server that died or became unreachable; Cut
// closes the current connections only, as a restart does; Stall holds
// every byte in both directions (a black hole, or a table lock as the
// client sees it) until Flow; SwallowAfter lets one statement through
// and drops every reply on its connection from then on, so that
// PostgreSQL commits a change whose answer never arrives.
type proxy struct {
	ln      net.Listener
	target  string
	mu      sync.Mutex
	cond    *sync.Cond // signalled when stalled or a link's state changes
	down    bool
	stalled bool
	closed  bool
	swallow []byte // a client chunk containing it triggers swallowing
	links   map[*link]struct{}
	wg      sync.WaitGroup
}

// link is one client connection and its connection to the server.
type link struct {
	client, server net.Conn
	dead           bool // closed by Cut; guarded by proxy.mu
	swallowing     bool // replies are dropped; guarded by proxy.mu
}

// newProxy starts a proxy to dsn's host and returns it with a DSN that
// goes through it. The proxy stops when t ends.
func newProxy(t *testing.T, dsn string) (*proxy, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("proxy: %s is not a URL: %v", dsn, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: u.Host, links: make(map[*link]struct{})}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	u.Host = ln.Addr().String()
	return p, u.String()
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.down || p.closed {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.mu.Unlock()
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		l := &link{client: c, server: up}
		p.mu.Lock()
		p.links[l] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(l, true)
		go p.pipe(l, false)
	}
}

// pipe copies one direction of l, chunk by chunk, holding each chunk
// while the proxy is stalled and dropping replies once l swallows.
func (p *proxy) pipe(l *link, toServer bool) {
	defer p.wg.Done()
	src, dst := l.server, l.client
	if toServer {
		src, dst = l.client, l.server
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.stalled && !p.closed && !l.dead {
				p.cond.Wait()
			}
			stop := p.closed || l.dead
			if toServer && p.swallow != nil && bytes.Contains(buf[:n], p.swallow) {
				p.swallow, l.swallowing = nil, true
			}
			drop := !toServer && l.swallowing
			p.mu.Unlock()
			if stop {
				break
			}
			if !drop {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
		}
		if err != nil {
			break
		}
	}
	p.mu.Lock()
	p.kill(l)
	p.mu.Unlock()
}

// kill closes l's connections; p.mu is held.
func (p *proxy) kill(l *link) {
	if !l.dead {
		l.dead = true
		l.client.Close()
		l.server.Close()
		delete(p.links, l)
		p.cond.Broadcast()
	}
}

// Cut closes every connection through the proxy.
func (p *proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		p.kill(l)
	}
}

// Down cuts every connection and refuses new ones until Up.
func (p *proxy) Down() {
	p.mu.Lock()
	p.down = true
	p.mu.Unlock()
	p.Cut()
}

// Up lets new connections through again.
func (p *proxy) Up() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}

// Stall holds every byte in both directions, on current and new
// connections, until Flow.
func (p *proxy) Stall() {
	p.mu.Lock()
	p.stalled = true
	p.mu.Unlock()
}

// Flow ends a Stall: what was held goes through.
func (p *proxy) Flow() {
	p.mu.Lock()
	p.stalled = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// SwallowAfter arms the proxy: the next chunk a client sends that contains
// marker goes to the server, and every reply on that connection from then
// on is dropped. The connection stays open, so the client waits for an
// answer that never comes.
func (p *proxy) SwallowAfter(marker string) {
	p.mu.Lock()
	p.swallow = []byte(marker)
	p.mu.Unlock()
}

func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for l := range p.links {
		p.kill(l)
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	p.wg.Wait()
}
