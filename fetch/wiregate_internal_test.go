package fetch

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/auditd/auditd/redact"
)

// countingListener counts the bytes the server reads from every
// connection it accepts.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{Conn: c, n: l.n}, nil
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// TestWireGateSendsNothingLate: a request on a fleet slot whose time to
// leave by passed before the transport came to write it reaches the
// upstream with not one byte, on a kept-alive connection and on a new
// one, with a body or none, and the client's error is errSlotPassed (also
// once scrubbed for the record). One in time goes as before, and so does
// one with no deadline on the connection a late one was refused on.
func TestWireGateSendsNothingLate(t *testing.T) {
	var read atomic.Int64
	var mu sync.Mutex
	closed := 0
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte("ok"))
	}))
	srv.Listener = countingListener{Listener: srv.Listener, n: &read}
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			mu.Lock()
			closed++
			mu.Unlock()
		}
	}
	srv.Start()
	defer srv.Close()
	closedNow := func() int {
		mu.Lock()
		defer mu.Unlock()
		return closed
	}

	client := NewClient(DefaultClientOptions())
	do := func(method string, body []byte, by time.Time) error {
		t.Helper()
		var r io.Reader = emptyBody{}
		if body != nil {
			r = bytes.NewReader(body)
		}
		req, err := http.NewRequest(method, srv.URL+"/x", r)
		if err != nil {
			t.Fatal(err)
		}
		req.GetBody = nil
		if body == nil {
			req.Body = emptyBody{}
		}
		resp, err := client.Do(gateWire(req, by, time.Now))
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return nil
	}
	// late sends a request past its time and checks that the connection
	// it was to go on closed with nothing more read by the server.
	late := func(name, method string, body []byte) {
		t.Helper()
		before, closes := read.Load(), closedNow()
		err := do(method, body, time.Now().Add(-time.Millisecond))
		if !errors.Is(err, errSlotPassed) || !errors.Is(scrubError(err, redact.New(nil)), errSlotPassed) {
			t.Fatalf("%s: a late request returned %v, want errSlotPassed", name, err)
		}
		for i := 0; closedNow() == closes; i++ {
			if i == 500 {
				t.Fatalf("%s: the connection of the late request never closed", name)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if got := read.Load(); got != before {
			t.Errorf("%s: the server read %d bytes of a request that was not to be sent", name, got-before)
		}
	}
	if err := do("GET", nil, time.Now().Add(time.Hour)); err != nil || read.Load() == 0 {
		t.Fatalf("a request in time: %v, %d bytes read", err, read.Load())
	}
	late("kept-alive GET", "GET", nil) // on the connection the first left idle
	late("new GET", "GET", nil)
	if err := do("POST", []byte(`{"a":1}`), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	late("kept-alive POST", "POST", []byte(`{"a":1}`))
	if err := do("GET", nil, time.Time{}); err != nil {
		t.Fatalf("a request with no deadline: %v", err)
	}
}
