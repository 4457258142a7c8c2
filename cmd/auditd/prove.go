package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
)

// runProve prints an inclusion proof of one event (--seq), or checks one
// offline (--check FILE) against the public key alone.
func runProve(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("prove", "prove --seq N | --check FILE [flags]", stdout, stderr)
	data := fs.String("data", "./data", "data `directory` holding auditd.db and the ledger key")
	seq := fs.Uint64("seq", 0, "sequence `number` of the event to prove (the ledger's first event is 1)")
	check := fs.String("check", "", "check the proof in `file` instead of making one")
	key := fs.String("key", "", "note verifier `key` (default: ledger.pub in the data directory)")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	seqGiven := false
	fs.Visit(func(f *flag.Flag) { seqGiven = seqGiven || f.Name == "seq" })
	switch {
	case seqGiven && *check != "":
		return fs.fail("give --seq N to make a proof or --check FILE to check one, not both")
	case !seqGiven && *check == "":
		return fs.fail("give --seq N to make a proof of event N, or --check FILE to check a proof")
	case seqGiven && *seq == 0:
		return fs.fail("--seq 0: sequence numbers start at 1, the ledger's first event")
	}
	vkey := *key
	if vkey == "" {
		var err error
		if vkey, err = ledger.ReadPublicKey(*data); err != nil {
			fmt.Fprintf(stderr, "auditd prove: %v\n", err)
			return 2
		}
	}
	if *check != "" {
		return checkProof(*check, vkey, stdout, stderr)
	}

	db, err := openDB(*data, true)
	if err != nil {
		fmt.Fprintf(stderr, "auditd prove: %v\n", err)
		return 2
	}
	defer db.Close()
	p, err := ledger.Prove(db, *seq, vkey)
	if err != nil {
		fmt.Fprintf(stderr, "auditd prove: %v\n", err)
		return 2
	}
	text, err := p.MarshalText()
	if err != nil {
		fmt.Fprintf(stderr, "auditd prove: %v\n", err)
		return 2
	}
	stdout.Write(text)
	return 0
}

// checkProof verifies a proof file: exit 0 and a summary of the proven
// event, or exit 1 saying why it does not hold.
func checkProof(path, vkey string, stdout, stderr io.Writer) int {
	b, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintf(stderr, "auditd prove: %v\n", err)
		return 2
	}
	var p ledger.Proof
	if err := p.UnmarshalText(b); err != nil {
		fmt.Fprintf(stdout, "proof does NOT hold: %v\n", err)
		return 1
	}
	e, tree, err := p.Verify(vkey)
	if err != nil {
		fmt.Fprintf(stdout, "proof does NOT hold: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "proof holds: event %d is in the ledger %s of %d events signed at %s\n\n",
		e.Seq, tree.Origin, tree.Size, tree.Time.Format(proofTime))
	if err := writeEventSummary(stdout, &e); err != nil {
		fmt.Fprintf(stderr, "auditd prove: %v\n", err)
		return 2
	}
	return 0
}

// proofTime is how prove prints times: UTC, RFC 3339 with milliseconds.
const proofTime = "2006-01-02T15:04:05.000Z07:00"

// writeEventSummary writes the proven event as the API shows it
// (auditd.EventJSON), one field a line, "name  value", leaving out the
// fields its type does not use, and its chain hashes, which the tree does
// not cover and a proof does not carry.
func writeEventSummary(w io.Writer, e *auditd.Event) error {
	j := auditd.NewEventJSON(e)
	v := reflect.ValueOf(j)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for i := range v.NumField() {
		name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
		f := v.Field(i)
		if f.IsZero() && name != "seq" || name == "prev_hash" || name == "hash" {
			continue
		}
		var val string
		switch x := f.Interface().(type) {
		case time.Time:
			val = x.UTC().Format(proofTime)
		case auditd.Duration:
			val = x.D().String()
		default:
			val = fmt.Sprint(x)
		}
		fmt.Fprintf(tw, "%s\t%s\n", name, val)
	}
	return tw.Flush()
}
