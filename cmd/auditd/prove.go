package main

import (
	"context"
	"fmt"
	"io"
)

// runProve is a placeholder until its issue lands; it says so and fails.
func runProve(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "auditd prove: not built yet")
	return 2
}
