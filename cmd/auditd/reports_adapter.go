package main

import (
	"context"
	"io"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/fetch"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/staging"
)

// reportsAPI is filled in when the reports package lands.
type reportsAPI struct {
	led   *ledger.Ledger
	loop  *fetch.Loop
	stage *staging.Store
}

func newReportsAPI(led *ledger.Ledger, loop *fetch.Loop, stage *staging.Store) reportsAPI {
	return reportsAPI{led: led, loop: loop, stage: stage}
}

func (reportsAPI) WriteReconciliation(ctx context.Context, w io.Writer, runID, format string) error {
	return auditd.Errorf(auditd.EUNAVAILABLE, "reports are not built yet")
}

func (reportsAPI) WriteRunEvidence(ctx context.Context, w io.Writer, runID string) error {
	return auditd.Errorf(auditd.EUNAVAILABLE, "reports are not built yet")
}

func (reportsAPI) WriteAwardEvidence(ctx context.Context, w io.Writer, q api.EvidenceQuery) error {
	return auditd.Errorf(auditd.EUNAVAILABLE, "reports are not built yet")
}
