package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/fleetlog"
	"github.com/auditd/auditd/internal/etcdtest"
)

// TestAdvertiseURL: the URL a node publishes for the other nodes' calls is
// --fleet-advertise when set, else the listener's, which must name a host
// they can reach.
func TestAdvertiseURL(t *testing.T) {
	local, remote := []string{"http://127.0.0.1:2379"}, []string{"http://10.0.0.1:2379", "10.0.0.2:2379"}
	for _, tc := range []struct {
		advertise, listen string
		etcd              []string
		want              string // "" when refused
	}{
		{"", "http://127.0.0.1:8080", local, "http://127.0.0.1:8080"},
		{"", "http://10.0.0.5:8080", remote, "http://10.0.0.5:8080"},
		{"", "http://127.0.0.1:8080", remote, ""}, // loopback, with etcd on other machines
		{"", "http://[::1]:8080", []string{"localhost:2379"}, "http://[::1]:8080"},
		{"", "http://0.0.0.0:8080", local, ""}, // every address: no host to reach
		{"", "http://[::]:8080", remote, ""},
		{"http://east-1.internal:8080/", "http://[::]:8080", remote, "http://east-1.internal:8080"},
		{"https://10.0.0.5:8443", "http://127.0.0.1:8080", remote, "https://10.0.0.5:8443"},
		{"east-1.internal:8080", "http://[::]:8080", remote, ""},            // no scheme
		{"ftp://east-1.internal", "http://[::]:8080", remote, ""},           // not http
		{"http://0.0.0.0:8080", "http://[::]:8080", remote, ""},             // unspecified again
		{"http://east-1.internal:8080/api", "http://[::]:8080", remote, ""}, // a path
		{"http://user:pw@east-1.internal:8080", "http://[::]:8080", remote, ""},
	} {
		got, err := advertiseURL(tc.advertise, tc.listen, tc.etcd)
		if tc.want == "" {
			if err == nil || !strings.Contains(err.Error(), "--fleet-advertise") {
				t.Errorf("advertise %q, listen %s, etcd %v: %q, %v; want an error naming --fleet-advertise", tc.advertise, tc.listen, tc.etcd, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("advertise %q, listen %s, etcd %v: %q, %v; want %s", tc.advertise, tc.listen, tc.etcd, got, err, tc.want)
		}
	}
}

// TestPeerCallChecksTheNodeThatAnswered: a call to a node's published
// address that another node answers (a loopback or wildcard address
// published on every machine reaches the caller itself) is refused, not
// taken as the node's part; a peer refusing the caller's token is named
// as such.
func TestPeerCallChecksTheNodeThatAnswered(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	dir := fleetlog.NewRuns(etcdtest.NewClient(t, cluster.Endpoints()...), "")
	answerAs := func(name string) string {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set(api.HeaderNode, name)
			w.Write([]byte("{}"))
		}))
		t.Cleanup(s.Close)
		return s.URL
	}
	ctx := context.Background()
	if err := dir.SetPeer(ctx, "east-1", answerAs("east-1")); err != nil {
		t.Fatal(err)
	}
	if err := dir.SetPeer(ctx, "east-2", answerAs("west-1")); err != nil {
		t.Fatal(err)
	}
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(api.HeaderNode, "east-3")
		w.WriteHeader(http.StatusUnauthorized)
	}))
	t.Cleanup(refusing.Close)
	if err := dir.SetPeer(ctx, "east-3", refusing.URL); err != nil {
		t.Fatal(err)
	}
	f := &fleetRuns{node: "west-1", dir: dir, http: http.DefaultClient}
	if err := f.peerCall(ctx, "east-1", "GET", "/v1/runs/r1", "Bearer x", nil, nil); err != nil {
		t.Fatalf("east-1 answering as itself: %v", err)
	}
	err := f.peerCall(ctx, "east-2", "GET", "/v1/runs/r1", "Bearer x", nil, nil)
	if err == nil || !strings.Contains(err.Error(), `answered as node "west-1"`) || !strings.Contains(err.Error(), "--fleet-advertise") {
		t.Fatalf("east-2's address answered by west-1: %v; want an error naming who answered and --fleet-advertise", err)
	}
	// A peer refusing the caller's token says what to do about it.
	err = f.peerCall(ctx, "east-3", "GET", "/v1/runs/r1", "Bearer x", nil, nil)
	if err == nil || !strings.Contains(err.Error(), "node east-3 refused the caller's token") || !strings.Contains(err.Error(), "same tokens") {
		t.Fatalf("east-3 answering 401: %v; want an error saying the nodes must share tokens", err)
	}
}

// TestNodeNameTakenIsRefused: a node name the fleet log holds under another
// ledger's key is refused before the node joins; its own key, or a name no
// node has posted under, is not.
func TestNodeNameTakenIsRefused(t *testing.T) {
	ctx := context.Background()
	cluster := etcdtest.Start(t, 1)
	client := etcdtest.NewClient(t, cluster.Endpoints()...)
	_, cp, key := fleetPackNode(t, t.TempDir(), 0, 3, nil)
	if _, err := fleetlog.New(client, fleetlog.Config{}).Post(ctx, fleetlog.Post{Node: "east-1", Key: key, Checkpoint: cp}); err != nil {
		t.Fatal(err)
	}
	if err := checkNodeName(ctx, client, "east-1", key); err != nil {
		t.Fatalf("east-1 under its own key: %v", err)
	}
	if err := checkNodeName(ctx, client, "east-2", "auditd/0badc0de+00000000+AAAA"); err != nil {
		t.Fatalf("a name nobody posted under: %v", err)
	}
	err := checkNodeName(ctx, client, "east-1", "auditd/0badc0de+00000000+AAAA")
	if err == nil || !strings.Contains(err.Error(), "--node east-1 is taken") || !strings.Contains(err.Error(), key) {
		t.Fatalf("east-1 under another key: %v, want it refused naming the key that holds it", err)
	}
}
