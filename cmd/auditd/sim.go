package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/sim"
)

// simShutdownTimeout bounds the graceful shutdown of the simulated upstreams.
const simShutdownTimeout = 5 * time.Second

// runSim serves every upstream of a scenario on its own loopback listener
// until ctx ends (SIGINT or SIGTERM in main). It prints "name base_url" per
// upstream, in scenario order, once all are listening, and with --urls-out
// also writes them as a JSON object, so scripts can wire sources to them.
// On the way out it prints what each upstream received to stderr.
func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("auditd sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	scenario := fs.String("scenario", "", "scenario file (YAML; see testdata/scenarios)")
	urlsOut := fs.String("urls-out", "", "also write {name: base_url} as JSON to this file")
	host := fs.String("host", sim.DefaultHost, "address to listen on")
	if err := fs.Parse(args); err != nil {
		return parseStatus(err)
	}
	if *scenario == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: auditd sim --scenario FILE [--urls-out FILE] [--host ADDR]")
		return 2
	}
	sc, err := sim.LoadScenario(*scenario)
	if err != nil {
		fmt.Fprintf(stderr, "auditd sim: %v\n", err)
		return 2
	}
	s, err := sim.New(sc, clock.Real{})
	if err != nil {
		fmt.Fprintf(stderr, "auditd sim: %v\n", err)
		return 2
	}
	s.Host = *host
	urls, err := s.Start(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "auditd sim: %v\n", err)
		return 1
	}
	code := 0
	if *urlsOut != "" {
		if err := writeURLs(*urlsOut, urls); err != nil {
			fmt.Fprintf(stderr, "auditd sim: %v\n", err)
			code = 1
		}
	}
	if code == 0 {
		for _, name := range s.Upstreams() {
			fmt.Fprintf(stdout, "%s %s\n", name, urls[name])
		}
		<-ctx.Done()
	}

	shutdown, cancel := context.WithTimeout(context.Background(), simShutdownTimeout)
	defer cancel()
	if err := s.Close(shutdown); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		fmt.Fprintf(stderr, "auditd sim: shutdown: %v\n", err)
		code = 1
	}
	for _, name := range s.Upstreams() {
		st := s.Stats(name)
		fmt.Fprintf(stderr, "%s received=%d by_status=%v dropped=%d body_errors=%d\n",
			name, st.Received, st.ByStatus, st.Dropped, st.BodyErrors)
	}
	return code
}

// writeURLs writes urls as JSON to path through a temporary file and a
// rename, so a script polling for the file never reads half of it.
func writeURLs(path string, urls map[string]string) error {
	data, err := json.MarshalIndent(urls, "", "  ")
	if err != nil {
		return fmt.Errorf("encode urls: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".urls-*.json")
	if err != nil {
		return fmt.Errorf("write urls: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("write urls: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write urls: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write urls: %w", err)
	}
	return nil
}
