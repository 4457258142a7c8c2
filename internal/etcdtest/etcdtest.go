// Package etcdtest starts real etcd members in the test's process, on
// loopback ports, for tests of the fleet: a cluster of n members, a client
// that reconnects quickly, and a TCP proxy the test can cut and heal to
// partition one node from etcd.
package etcdtest

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// Cluster is an in-process etcd cluster on loopback ports.
type Cluster struct {
	Members []*Member
}

type Member struct {
	name   string
	Client string // client URL
	mu     sync.Mutex
	etcd   *embed.Etcd // nil once stopped
}

// Start starts n etcd members and waits until they serve; they stop
// when the test ends. A cluster that does not come up (a port taken
// between freeAddr and etcd's bind) is stopped and started again on other
// ports, up to three times.
func Start(tb testing.TB, n int) *Cluster {
	tb.Helper()
	var err error
	for range 3 {
		var c *Cluster
		if c, err = tryCluster(tb, n); err == nil {
			for _, m := range c.Members {
				tb.Cleanup(m.Stop)
			}
			return c
		}
		tb.Logf("etcd cluster did not start, trying other ports: %v", err)
	}
	tb.Fatalf("etcd cluster: %v", err)
	return nil
}

func tryCluster(tb testing.TB, n int) (*Cluster, error) {
	c := &Cluster{}
	peers := make([]string, n)
	for i := range n {
		c.Members = append(c.Members, &Member{name: fmt.Sprintf("m%d", i), Client: "http://" + FreeAddr(tb)})
		peers[i] = fmt.Sprintf("m%d=http://%s", i, FreeAddr(tb))
	}
	stopAll := func() {
		for _, m := range c.Members {
			m.Stop()
		}
	}
	for i, m := range c.Members {
		cfg := embed.NewConfig()
		cfg.Name = m.name
		cfg.Dir = tb.TempDir()
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
		peer := mustURL(tb, strings.SplitN(peers[i], "=", 2)[1])
		client := mustURL(tb, m.Client)
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
		cfg.InitialCluster = strings.Join(peers, ",")
		cfg.InitialClusterToken = "fleet-test"
		cfg.ClusterState = embed.ClusterStateFlagNew
		cfg.TickMs, cfg.ElectionMs = 25, 250
		cfg.UnsafeNoFsync = true
		e, err := embed.StartEtcd(cfg)
		if err != nil {
			stopAll()
			return nil, fmt.Errorf("start %s: %w", m.name, err)
		}
		m.etcd = e
	}
	for _, m := range c.Members {
		select {
		case <-m.etcd.Server.ReadyNotify():
		case <-time.After(30 * time.Second): // a guard against a hang, not a timing assertion
			stopAll()
			return nil, fmt.Errorf("%s not ready", m.name)
		}
	}
	return c, nil
}

// Stop stops the member. A member that never joined its cluster can block
// in Close for good; past a bound the test goes on without it.
func (m *Member) Stop() {
	m.mu.Lock()
	e := m.etcd
	m.etcd = nil
	m.mu.Unlock()
	if e == nil {
		return
	}
	done := make(chan struct{})
	go func() {
		e.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second): // a guard against a hang, not a timing assertion
	}
}

// Leader returns the index of the member that leads, or -1.
func (c *Cluster) Leader() int {
	for i, m := range c.Members {
		m.mu.Lock()
		e := m.etcd
		m.mu.Unlock()
		if e != nil && e.Server.Leader() == e.Server.MemberID() {
			return i
		}
	}
	return -1
}

// Endpoints returns the members' client URLs.
func (c *Cluster) Endpoints() []string {
	var eps []string
	for _, m := range c.Members {
		eps = append(eps, m.Client)
	}
	return eps
}

// NewClient returns an etcd client of endpoints that closes when the test
// ends. It reconnects quickly, so that a test healing a cut sees it soon.
func NewClient(tb testing.TB, endpoints ...string) *clientv3.Client {
	tb.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 200 * time.Millisecond},
			MinConnectTimeout: time.Second,
		})},
	})
	if err != nil {
		tb.Fatalf("etcd client: %v", err)
	}
	tb.Cleanup(func() { cli.Close() })
	return cli
}

// FreeAddr returns a loopback address with a port below the ephemeral range.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	// Below Linux's ephemeral range (32768 and up): a port the kernel
	// hands an outgoing connection of another test between this check
	// and etcd's bind would keep a member from starting.
	for range 100 {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", 20000+rand.IntN(12000)))
		if err != nil {
			continue
		}
		defer ln.Close()
		return ln.Addr().String()
	}
	tb.Fatal("no free port below the ephemeral range")
	return ""
}

func mustURL(tb testing.TB, s string) url.URL {
	u, err := url.Parse(s)
	if err != nil {
		tb.Fatal(err)
	}
	return *u
}

// Proxy is a TCP proxy between a node's client and an etcd member that the
// test can cut (every connection closed, new ones refused) and heal.
type Proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]struct{}
}

// StartProxy starts a Proxy to targetURL that closes when the test ends.
func StartProxy(tb testing.TB, targetURL string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{ln: ln, target: strings.TrimPrefix(targetURL, "http://"), conns: make(map[net.Conn]struct{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	tb.Cleanup(func() {
		ln.Close()
		<-done
		p.Cut()
	})
	return p
}

// URL is the proxy's client URL.
func (p *Proxy) URL() string { return "http://" + p.ln.Addr().String() }

func (p *Proxy) serve(c net.Conn) {
	if !p.track(c) {
		c.Close()
		return
	}
	up, err := net.Dial("tcp", p.target)
	if err != nil || !p.track(up) {
		c.Close()
		if up != nil {
			up.Close()
		}
		return
	}
	go func() { _, _ = io.Copy(up, c); up.Close() }()
	_, _ = io.Copy(c, up)
	c.Close()
}

// track registers conn unless the proxy is cut.
func (p *Proxy) track(conn net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	p.conns[conn] = struct{}{}
	return true
}

// Cut closes every connection and refuses new ones until Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// Heal lets connections through again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}
