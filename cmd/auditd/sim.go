package main

import (
	"context"
	"fmt"
	"io"
)

// runSim is a placeholder until its issue lands; it says so and fails.
func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "auditd sim: not built yet")
	return 2
}
