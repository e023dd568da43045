// Package replaytest serves HTTP/1.1 on loopback in the way that makes
// net/http replay a keyed request on its own: every connection answers its
// first request (200, keep-alive) and closes after reading its second,
// without answering. A client that sends requests one after another
// reuses the idle connection, loses it after writing, and net/http writes
// the request again on a new connection, because a request carrying an
// Idempotency-Key header is replayable (net/http's isReplayable). So n
// sequential requests reach the server 2n-1 times, and the server counts
// every one it read.
package replaytest

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
)

// Server is a loopback HTTP/1.1 server that drops every connection's
// second request.
type Server struct {
	// URL is the server's base URL, http://127.0.0.1:port.
	URL string

	ln       net.Listener
	requests atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	closed   bool // Close ran: a connection accepted since is closed at once
}

// New starts a Server on a loopback port.
func New() (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{URL: "http://" + ln.Addr().String(), ln: ln, conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Requests returns how many requests the server has read.
func (s *Server) Requests() int { return int(s.requests.Load()) }

// Close stops the server, closes its connections and waits for its
// goroutines.
func (s *Server) Close() {
	s.ln.Close()
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			// Accepted just before the listener closed, after Close
			// closed the connections it knew.
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

// serve answers c's first request and closes c after reading its second.
func (s *Server) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()
	br := bufio.NewReader(c)
	for n := 1; n <= 2; n++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, err = io.Copy(io.Discard, req.Body)
		req.Body.Close()
		if err != nil {
			return
		}
		s.requests.Add(1)
		if n == 2 {
			return
		}
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"); err != nil {
			return
		}
	}
}
