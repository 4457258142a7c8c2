package main

import (
	"context"
	"fmt"
	"io"
)

// runReconcile is a placeholder until its issue lands; it says so and fails.
func runReconcile(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "auditd reconcile: not built yet")
	return 2
}
