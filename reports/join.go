package reports

import (
	"time"

	"github.com/auditd/auditd"
)

// dispatchRow is one row of the Dispatches sheet: a dispatch joined with
// its outcome and, for a success, the payload staged from it. It keeps only
// the fields the row shows; rows are recycled.
type dispatchRow struct {
	seq               uint64
	run, item, source string
	method, path      string
	page, attempt     uint32
	cost              int64 // what its admission was charged (records.go)
	at                time.Time
	hash              [32]byte
	result            auditd.EventType // "" until the outcome arrives
	resultAt          time.Time
	status            int
	bytes             int64
	latency           time.Duration
	outcome           auditd.Outcome
	bodyErr, errText  string
	payload           string
	done              bool
	heldForPayload    bool // a success waiting for its item's payload.staged
}

// joiner writes dispatch rows in dispatch order once each is complete. A
// row is complete when its outcome arrived and, for a success, when the
// item staged its payload, finished or dispatched its next page (the
// payload of a paged item belongs to its last page). Rows wait in a queue
// bounded by most, so memory stays flat whatever the run's length.
type joiner struct {
	w       rowWriter
	most    int
	q       []*dispatchRow
	head    int
	free    []*dispatchRow
	open    map[reqKey]*dispatchRow
	payload map[string]*dispatchRow // item -> success row waiting for its payload
	redact  *redactor
}

func newJoiner(w rowWriter, most int, redact *redactor) *joiner {
	return &joiner{w: w, most: most, redact: redact, open: make(map[reqKey]*dispatchRow), payload: make(map[string]*dispatchRow)}
}

func (j *joiner) observe(e *auditd.Event) error {
	switch e.Type {
	case auditd.EventDispatch:
		j.release(e.ItemKey)
		r := j.newRow()
		r.seq, r.run, r.item, r.source, r.method, r.path = e.Seq, e.RunID, e.ItemKey, e.SourceID, e.Method, e.Path
		r.page, r.attempt, r.at, r.hash = e.Page, e.Attempt, e.Time, e.Hash
		r.cost = int64(auditd.DispatchCost(e))
		j.q = append(j.q, r)
		j.open[reqKey{e.ItemKey, e.Page}] = r
	case auditd.EventResponse, auditd.EventThrottle, auditd.EventTransportError, auditd.EventInterrupted:
		k := reqKey{e.ItemKey, e.Page}
		r := j.open[k]
		if r == nil || r.attempt != e.Attempt {
			return nil // no dispatch waits for it; the reconciliation says so (R2)
		}
		delete(j.open, k)
		r.result, r.resultAt, r.status, r.bytes, r.latency = e.Type, e.Time, e.Status, e.Bytes, e.Latency
		r.outcome, r.bodyErr, r.errText = e.Outcome, e.BodyError, e.ErrorText
		if e.Type == auditd.EventResponse && e.Outcome == auditd.OutcomeSuccess {
			j.release(e.ItemKey)
			r.heldForPayload = true
			j.payload[e.ItemKey] = r
		} else {
			r.done = true
		}
	case auditd.EventPayloadStaged:
		if r := j.payload[e.ItemKey]; r != nil {
			r.payload = e.PayloadHash
		}
		j.release(e.ItemKey)
	case auditd.EventItemFinished:
		j.release(e.ItemKey)
	default:
		return nil
	}
	return j.flush(false)
}

func (j *joiner) newRow() *dispatchRow {
	if n := len(j.free); n > 0 {
		r := j.free[n-1]
		j.free = j.free[:n-1]
		return r
	}
	return new(dispatchRow)
}

func (j *joiner) release(item string) {
	if r := j.payload[item]; r != nil {
		r.done = true
		delete(j.payload, item)
	}
}

// flush writes complete rows from the head of the queue; with all, or when
// the queue is over its bound, incomplete ones too.
func (j *joiner) flush(all bool) error {
	for j.head < len(j.q) {
		r := j.q[j.head]
		if !r.done && !all && len(j.q)-j.head <= j.most {
			break
		}
		if err := j.write(r); err != nil {
			return err
		}
		if r.heldForPayload && j.payload[r.item] == r {
			delete(j.payload, r.item)
		}
		if k := (reqKey{r.item, r.page}); r.result == "" && j.open[k] == r {
			delete(j.open, k)
		}
		j.q[j.head] = nil
		j.head++
		*r = dispatchRow{}
		j.free = append(j.free, r)
	}
	if j.head > 1024 && j.head*2 > len(j.q) {
		n := copy(j.q, j.q[j.head:])
		clear(j.q[n:])
		j.q, j.head = j.q[:n], 0
	}
	return nil
}

// drain writes every row still held, at the end of a run.
func (j *joiner) drain() error {
	err := j.flush(true)
	clear(j.open)
	clear(j.payload)
	return err
}

func (j *joiner) write(r *dispatchRow) error {
	var (
		completed              any
		kind, outcome, errText string
		status, bytes, latency any
	)
	if r.result != "" {
		completed, kind = r.resultAt, string(r.result)
		switch r.result {
		case auditd.EventResponse, auditd.EventThrottle:
			status, bytes, latency, outcome = r.status, r.bytes, seconds(r.latency), string(r.outcome)
			if r.result == auditd.EventThrottle {
				outcome = string(auditd.OutcomeThrottled)
			}
		case auditd.EventTransportError:
			latency, errText = seconds(r.latency), j.redact.sourceText(r.source, r.errText)
		}
	}
	return j.w.row(r.seq, r.run, r.item, r.page, r.attempt, r.cost, r.source, r.method, j.redact.sourcePath(r.source, r.path), r.at,
		completed, kind, status, r.bodyErr, outcome, errText, bytes, latency, r.payload, hexHash(r.hash))
}
