package auditd

import (
	"encoding/hex"
	"time"
)

// EventJSON is an event as the API and evidence packs show it: snake_case,
// durations as Go duration strings, hashes in hex, zero fields left out.
type EventJSON struct {
	Seq            uint64    `json:"seq"`
	Type           EventType `json:"type"`
	RunID          string    `json:"run_id,omitempty"`
	SourceID       string    `json:"source_id,omitempty"`
	ItemKey        string    `json:"item_key,omitempty"`
	Page           uint32    `json:"page,omitempty"`
	Attempt        uint32    `json:"attempt,omitempty"`
	Time           time.Time `json:"time"`
	Mono           Duration  `json:"mono,omitempty"`
	IdempotencyKey string    `json:"idempotency_key,omitempty"`
	Method         string    `json:"method,omitempty"`
	Path           string    `json:"path,omitempty"`
	Status         int       `json:"status,omitempty"`
	Bytes          int64     `json:"bytes,omitempty"`
	Latency        Duration  `json:"latency,omitempty"`
	Wait           Duration  `json:"wait,omitempty"`
	Actual         Duration  `json:"actual,omitempty"`
	RetryAfterRaw  string    `json:"retry_after_raw,omitempty"`
	RetryAfter     Duration  `json:"retry_after,omitempty"`
	Clamped        bool      `json:"clamped,omitempty"`
	Backoff        Duration  `json:"backoff,omitempty"`
	From           string    `json:"from,omitempty"`
	To             string    `json:"to,omitempty"`
	Failures       int       `json:"failures,omitempty"`
	Threshold      int       `json:"threshold,omitempty"`
	Cooldown       Duration  `json:"cooldown,omitempty"`
	OldLimit       int       `json:"old_limit,omitempty"`
	NewLimit       int       `json:"new_limit,omitempty"`
	OldWindow      Duration  `json:"old_window,omitempty"`
	NewWindow      Duration  `json:"new_window,omitempty"`
	Group          string    `json:"group,omitempty"`
	Outcome        Outcome   `json:"outcome,omitempty"`
	BodyError      string    `json:"body_error,omitempty"`
	PayloadHash    string    `json:"payload_hash,omitempty"`
	Cause          string    `json:"cause,omitempty"`
	Principal      string    `json:"principal,omitempty"`
	Detail         string    `json:"detail,omitempty"`
	PrevHash       string    `json:"prev_hash"`
	Hash           string    `json:"hash"`
}

// NewEventJSON returns e as EventJSON.
func NewEventJSON(e *Event) EventJSON {
	attempt, cause := e.Shared() // "attempt" and "cause" hold what the ledger's encoding does
	return EventJSON{
		Seq: e.Seq, Type: e.Type, RunID: e.RunID, SourceID: e.SourceID, ItemKey: e.ItemKey,
		Page: e.Page, Attempt: attempt, Time: e.Time.UTC(), Mono: Duration(e.Mono),
		IdempotencyKey: e.IdempotencyKey, Method: e.Method, Path: e.Path, Status: e.Status,
		Bytes: e.Bytes, Latency: Duration(e.Latency), Wait: Duration(e.Wait),
		Actual: Duration(e.Actual), RetryAfterRaw: e.RetryAfterRaw,
		RetryAfter: Duration(e.RetryAfter), Clamped: e.Clamped, Backoff: Duration(e.Backoff),
		From: e.From, To: e.To, Failures: e.Failures, Threshold: e.Threshold,
		Cooldown: Duration(e.Cooldown), OldLimit: e.OldLimit, NewLimit: e.NewLimit,
		OldWindow: Duration(e.OldWindow), NewWindow: Duration(e.NewWindow),
		Group: e.Group, Outcome: e.Outcome, BodyError: e.BodyError, PayloadHash: e.PayloadHash,
		Cause: cause, Principal: e.Principal, Detail: e.Detail,
		PrevHash: hex.EncodeToString(e.PrevHash[:]), Hash: hex.EncodeToString(e.Hash[:]),
	}
}
