package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/auditd/auditd/auth"
	"github.com/auditd/auditd/registry"
)

// runFleetDemo is `auditd fleet-demo` (make run-fleet): one etcd member,
// embedded, and three nodes serving the demo's simulator in this process,
// each on its own data directory and port, sharing every source's budget
// through the etcd. It is a demonstration: a real fleet runs one
// `auditd serve --fleet-etcd URLS --node NAME` per machine on an etcd
// cluster (docs/FLEET.md).
func runFleetDemo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fleet-demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dataDir := fs.String("data", "./data-fleet", "`directory` holding the etcd member's and each node's data")
	scenario := fs.String("demo", "testdata/scenarios/demo.yaml", "simulator `scenario` every node serves and runs")
	etcdAddr := fs.String("etcd", "127.0.0.1:2379", "client `address` of the embedded etcd member")
	peerAddr := fs.String("etcd-peer", "127.0.0.1:2380", "peer `address` of the embedded etcd member")
	firstPort := fs.Int("port", 8081, "the first node's `port`; the others take the next two")
	if err := fs.Parse(args); err != nil {
		return parseStatus(err)
	}
	token, err := demoFleetToken(*dataDir, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "auditd fleet-demo: %v\n", err)
		return 1
	}
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = "fleet-demo", filepath.Join(*dataDir, "etcd")
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	client := url.URL{Scheme: "http", Host: *etcdAddr}
	peer := url.URL{Scheme: "http", Host: *peerAddr}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "auditd fleet-demo: etcd: %v\n", err)
		return 1
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		fmt.Fprintln(stderr, "auditd fleet-demo: etcd did not become ready in 30s")
		return 1
	}
	fmt.Fprintf(stdout, "etcd serving on %s\n", client.String())

	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range 3 {
		node := fmt.Sprintf("node%d", i+1)
		o := serveOptions{dataDir: filepath.Join(*dataDir, node), addr: fmt.Sprintf("127.0.0.1:%d", *firstPort+i), demo: *scenario,
			registry: registry.Options{DefaultLimit: registry.DefaultLimit, DefaultWindow: registry.DefaultWindow},
			fleet:    fleetOptions{Etcd: []string{client.String()}, Node: node}, bootstrap: token}
		wg.Go(func() { errs[i] = serve(ctx, o, stdout, log) })
	}
	wg.Wait()
	status := 0
	for i, err := range errs {
		if err != nil {
			fmt.Fprintf(stderr, "auditd fleet-demo: node%d: %v\n", i+1, err)
			status = 1
		}
	}
	return status
}

// demoFleetToken returns the admin token every node of the demo fleet
// starts with: a node calling another for its part of a fleet run carries
// its caller's token, so the nodes need the same one. It is
// AUDITD_BOOTSTRAP_TOKEN when set, else the one kept in dir's
// bootstrap-token, else a new one kept there (mode 0600). It prints the
// token, and a warning when the nodes' data was made with a token each.
func demoFleetToken(dir string, stdout io.Writer) (string, error) {
	if t := os.Getenv(auth.BootstrapEnv); t != "" {
		return t, nil
	}
	path := filepath.Join(dir, auth.BootstrapFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		t := string(bytes.TrimSpace(b))
		fmt.Fprintf(stdout, "admin token of every node: in %s\n", path)
		return t, nil
	case !errors.Is(err, os.ErrNotExist):
		return "", err
	}
	t, err := auth.NewSecret(rand.Reader)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	if err := os.WriteFile(path, []byte(t+"\n"), 0o600); err != nil {
		return "", err
	}
	fmt.Fprintf(stdout, "admin token of every node (shown once; also in %s, mode 0600):\n  %s\n", path, t)
	if _, err := os.Stat(filepath.Join(dir, "node1", dbFile)); err == nil {
		fmt.Fprintf(stdout, "warning: %s holds nodes made with a token each, which fleet runs cannot use across nodes; remove %s to start the demo with one token\n", dir, dir)
	}
	return t, nil
}
