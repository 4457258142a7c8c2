package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"testing"
)

// TestStopperStopsLastStartedFirst: serve pushes each part as it starts it
// (the ledger, the demo upstreams, the fetch loop, the API), so whichever
// return it takes, the loop is drained before the ledger is closed; a part
// that fails to stop is logged and the rest are stopped still, under one
// deadline.
func TestStopperStopsLastStartedFirst(t *testing.T) {
	var logs bytes.Buffer
	s := &stopper{log: slog.New(slog.NewTextHandler(&logs, nil))}
	var order []string
	var deadlines []bool
	for _, what := range []string{"close ledger", "drain fetch loop", "shut down API"} {
		s.push(what, func(ctx context.Context) error {
			order = append(order, what)
			_, ok := ctx.Deadline()
			deadlines = append(deadlines, ok)
			if what == "drain fetch loop" {
				return errors.New("drain timed out")
			}
			return nil
		})
	}
	s.run()
	if want := []string{"shut down API", "drain fetch loop", "close ledger"}; !reflect.DeepEqual(order, want) {
		t.Errorf("stopped in the order %q, want %q", order, want)
	}
	if !reflect.DeepEqual(deadlines, []bool{true, true, true}) {
		t.Errorf("steps ran with deadlines %v", deadlines)
	}
	if !strings.Contains(logs.String(), "drain fetch loop") || !strings.Contains(logs.String(), "drain timed out") {
		t.Errorf("the failed step was not logged: %s", logs.String())
	}
}
