package main

import (
	"context"
	"fmt"
	"io"
)

// runServe is a placeholder until its issue lands; it says so and fails.
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "auditd serve: not built yet")
	return 2
}
