package main

import (
	"context"
	"fmt"
	"io"
)

// runExport is a placeholder until its issue lands; it says so and fails.
func runExport(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "auditd export: not built yet")
	return 2
}
