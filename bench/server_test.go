package bench

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The server runs in a child process (this test binary, re-executed with
// serverEnv set), so that the allocations, heap and fsyncs measured in the
// benchmark process are the clients' alone.
const serverEnv = "IDEMBENCH_SERVER"

// serverURL is the child server's base URL, set by TestMain.
var serverURL string

// Paths the child server answers:
//
//	/ok     200 with a small JSON body
//	/flaky  503 on every 10th attempt (counted per server), 200 otherwise
//	/large  reads the whole body, then holds the response until
//	        largeInFlight requests have arrived (at most 2 s), so that the
//	        requests of one burst are all in flight together; then 200
const (
	pathOK    = "/ok"
	pathFlaky = "/flaky"
	pathLarge = "/large"
)

var okBody = []byte(`{"id":"ch_1","object":"charge","status":"succeeded"}`)

func TestMain(m *testing.M) {
	if os.Getenv(serverEnv) == "1" {
		serve()
		return
	}
	cmd, url, err := startServer()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: starting server:", err)
		os.Exit(1)
	}
	serverURL = url
	code := m.Run()
	cmd.Process.Kill()
	cmd.Wait()
	os.Exit(code)
}

// startServer re-executes the test binary as the server and reads its
// address from the child's first line of output.
func startServer() (*exec.Cmd, string, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), serverEnv+"=1", "GOMAXPROCS=")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, "", err
	}
	_ = stdin // closed when this process exits, which stops the child
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, "", fmt.Errorf("reading address: %w", err)
	}
	return cmd, "http://" + strings.TrimSpace(line), nil
}

// serve runs the loopback server until its stdin closes.
func serve() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench server:", err)
		os.Exit(1)
	}
	var flaky atomic.Uint64
	mux := http.NewServeMux()
	mux.HandleFunc(pathOK, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Write(okBody)
	})
	mux.HandleFunc(pathFlaky, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if flaky.Add(1)%10 == 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error":"unavailable"}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(okBody)
	})
	var bmu sync.Mutex
	arrived, release := 0, make(chan struct{})
	mux.HandleFunc(pathLarge, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		bmu.Lock()
		wait := release
		if arrived++; arrived == largeInFlight {
			close(release)
			arrived, release = 0, make(chan struct{})
		}
		bmu.Unlock()
		select {
		case <-wait:
		case <-time.After(2 * time.Second):
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(okBody)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		io.Copy(io.Discard, os.Stdin) // returns when the parent exits
		os.Exit(0)
	}()
	fmt.Println(ln.Addr().String())
	srv.Serve(ln)
}
