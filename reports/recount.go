package reports

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/auditd/auditd"
)

// Breaker states as the fetch loop records them (docs/EVENTS.md).
const (
	breakerClosed   = "closed"
	breakerOpen     = "open"
	breakerHalfOpen = "half_open"
)

// ctxEvery is how many events pass between context checks.
const ctxEvery = 1 << 14

// errStop ends a scan early; it never leaves this package.
var errStop = errors.New("stop scan")

// tally is one check's running count in one scope.
type tally struct {
	expected, actual int64
	offending        []uint64
	na               string // non-empty: the check does not apply, and why
	note             string
}

func (t *tally) offend(seq uint64, most int) {
	t.offending = append(t.offending, seq)
	if len(t.offending) > 4*most+16 {
		t.offending = firstSeqs(t.offending, most)
	}
}

func firstSeqs(s []uint64, most int) []uint64 {
	slices.Sort(s)
	s = slices.Compact(s)
	if len(s) > most {
		s = s[:most:most]
	}
	return s
}

// scope is the recount of one source (or of run-level events, id "").
type scope struct {
	id     string
	at     uint32 // its index in recount.scopes
	counts LedgerCounts
	checks [numChecks]tally

	// R4: throttle seqs found violated.
	violated map[uint64]bool

	// R5: breaker state.
	breaker string

	// R9: limit in force and the dispatches inside the current window
	// (records.go).
	limit, burst int
	window       time.Duration
	win          recordWindow // requests, against the limit in force
	ceil         ceiling      // records, against the configured ceiling
	control      ControlEvidence
	margin       int64 // smallest allowance - count seen; starts high
	limited      bool  // a limit was ever recorded

	// R10: the items behind a failure, named in its note.
	unacked     []keyAt // delivered and not acknowledged
	undelivered []keyAt // acknowledged and not delivered
}

// keyAt is an item key with the seq of the event that names it.
type keyAt struct {
	seq uint64
	key string
}

// await is a throttle of an item's request (the item's page) whose pause
// wait has not been seen yet.
type await struct {
	seq  uint64
	page uint32
	src  *scope // scope the throttle counted in
}

// reqKey is a request of the evidence join (join.go): an item and a page.
type reqKey struct {
	item string
	page uint32
}

// reqID is a request of the recount: an item, by its index in
// recount.items, and a page.
type reqID struct {
	item uint32
	page uint32
}

// request is the state of one (item, page) between its dispatches.
type request struct {
	attempts    uint32 // highest attempt dispatched
	dispatchSeq uint64 // seq of that dispatch
	outstanding bool   // dispatched, no outcome yet
	retryable   bool   // last outcome allows a retry
}

// pause is the latest pause of a source or group, set by a throttle.
type pause struct {
	from, until time.Time
	seq         uint64
	src         *scope
}

// recount is one pass over a run's events.
type recount struct {
	runID        string
	maxOffending int
	bursts       map[string]int
	hash         HashFunc
	payloads     PayloadVerifier
	payloadErr   error
	purged       int              // staged payloads purged under retention: counted, not re-hashed
	pending      []pendingPayload // staged payloads to re-hash once the scan pauses

	run      RunSummary
	finished bool
	finSeq   uint64 // run.finished
	// statusNote says how run.finished's status disagrees with the
	// items' ends (R1); empty when it does not.
	statusNote string
	first      uint64
	last       uint64
	headAtEnd  [32]byte
	total      LedgerCounts // events of the run, all scopes

	sources   map[string]*scope
	scopes    []*scope // by index (item.src)
	lastScope *scope   // the one source returned last
	items     *itemTable
	awaits    map[uint32]await // by item
	reqs      map[reqID]request
	groupOf   map[string]string
	pauses    map[string]*pause
	hasAck    bool
	cached    []CachedItem

	chain *chainCheck
}

func (r *Reconciler) newRecount(runID string) *recount {
	most := r.MaxOffending
	if most <= 0 {
		most = DefaultMaxOffending
	}
	return &recount{
		runID:        runID,
		maxOffending: most,
		bursts:       r.Bursts,
		hash:         r.Hash,
		payloads:     r.Payloads,
		run:          RunSummary{ID: runID, Status: "unfinished"},
		sources:      make(map[string]*scope),
		items:        newItemTable(),
		awaits:       make(map[uint32]await),
		reqs:         make(map[reqID]request),
		groupOf:      make(map[string]string),
		pauses:       make(map[string]*pause),
	}
}

// source returns the scope of source id, creating it. The id is cloned: the
// reader may reuse the memory behind the event it hands out.
func (rc *recount) source(id string) *scope {
	if s := rc.lastScope; s != nil && s.id == id {
		return s // most events are of the source before them
	}
	if s, ok := rc.sources[id]; ok {
		rc.lastScope = s
		return s
	}
	id = strings.Clone(id)
	s := &scope{id: id, at: uint32(len(rc.scopes)), breaker: breakerClosed, violated: make(map[uint64]bool), margin: 1 << 62}
	s.control.SourceID, s.control.Unit = id, UnitRequests
	s.burst = rc.bursts[id]
	rc.sources[id] = s
	rc.scopes = append(rc.scopes, s)
	return s
}

// observe counts one of the run's events, in ledger order, in its scope
// and the run's, and holds it to the identities it bears on.
func (rc *recount) observe(e *auditd.Event) {
	if e.Type.Access() {
		return // a read of the run's records, not part of them (R8 covers it all the same)
	}
	rc.total.Events++
	if rc.first == 0 {
		rc.first = e.Seq
		rc.run.HeadAtStart = hex.EncodeToString(e.PrevHash[:])
	}
	rc.last, rc.headAtEnd = e.Seq, e.Hash // encoded once, in report

	s := rc.source(e.SourceID)
	s.counts.Events++

	switch e.Type {
	case auditd.EventRunStarted:
		rc.runStarted(e)
	case auditd.EventRunFinished:
		rc.finished, rc.finSeq = true, e.Seq
		rc.run.Status = string(e.Outcome)
		rc.run.FinishedAt = e.Time.UTC()
	case auditd.EventRegistrySnapshot, auditd.EventRegistryChanged:
		rc.registry(s, e)
	case auditd.EventRunResumed:
		rc.resumed()
	case auditd.EventItemQueued:
		rc.queued(s, e)
	case auditd.EventDispatch:
		rc.dispatch(s, e)
	case auditd.EventResponse, auditd.EventThrottle, auditd.EventTransportError, auditd.EventInterrupted:
		rc.outcome(s, e)
	case auditd.EventWait:
		s.counts.Waits++
		// Any wait of the throttled request honours its throttle: the
		// limiter names the gate that held it longest (a rate cut by the
		// same 429 can outlast the pause), and the pause check in dispatch
		// proves no request went before the pause ended.
		if i, it := rc.item(e.ItemKey); it != nil {
			if a, ok := rc.awaits[i]; ok && a.page == e.Page {
				delete(rc.awaits, i)
			}
		}
	case auditd.EventBreaker:
		rc.breaker(s, e)
	case auditd.EventPayloadStaged:
		rc.staged(s, e)
	case auditd.EventCacheServed:
		rc.cacheServed(s, e)
	case auditd.EventItemFinished:
		rc.itemFinished(s, e)
	case auditd.EventAcknowledged:
		rc.acknowledged(s, e)
	}
}

// queued counts an item queued (R1), once a key.
func (rc *recount) queued(s *scope, e *auditd.Event) {
	s.counts.Queued++
	c := &s.checks[0] // R1
	c.expected++
	i, ok := rc.items.find(e.ItemKey)
	if !ok {
		i = rc.items.add(e.ItemKey)
	}
	it := rc.items.at(i)
	if it.has(itemQueued) {
		c.offend(e.Seq, rc.maxOffending)
		return
	}
	// A key dispatched before it was queued keeps its requests' state.
	it.flags, it.src = itemQueued, s.at
}

// item returns the index and record of the item of key, or a nil record
// when no item.queued named it.
func (rc *recount) item(key string) (uint32, *item) {
	i, ok := rc.items.find(key)
	if !ok {
		return 0, nil
	}
	if it := rc.items.at(i); it.has(itemQueued) {
		return i, it
	}
	return i, nil
}

// registry counts a registry snapshot or change of s and takes the limit
// and burst in force from it (R9), and the source's group.
func (rc *recount) registry(s *scope, e *auditd.Event) {
	s.counts.Registry++
	if e.Group != "" {
		rc.groupOf[s.id] = strings.Clone(e.Group)
	}
	if e.NewLimit > 0 && e.NewWindow > 0 {
		// A slower limit counts the dispatches after it (R9): those
		// before it were within the limit in force then, as the limiter
		// counts them (limiter.Budget.SetLimit).
		if e.Type == auditd.EventRegistryChanged && s.limited &&
			float64(e.NewLimit)*float64(s.window) < float64(s.limit)*float64(e.NewWindow) {
			s.win.restart()
		}
		s.limit, s.window, s.limited = e.NewLimit, e.NewWindow, true
	}
	// A snapshot records the burst the limiter allowed and the configured
	// ceiling (records.go).
	rc.snapshotDetail(s, e)
}

// resumed forgets what a restart lost: an item whose response came back
// but whose payload was not yet staged is fetched again, so after a resume
// any request of an unfinished item may be retried, and its payload may
// be staged a second time (the later one stands).
func (rc *recount) resumed() {
	for k, req := range rc.reqs {
		req.retryable = true
		rc.reqs[k] = req
	}
	for i := range rc.items.n {
		if it := rc.items.at(i); it.has(itemStaged) && !it.has(itemFinished) {
			it.flags |= itemRestage
		}
	}
}

// breaker counts a breaker transition of s and holds it to R5: it starts
// from the state the last one left, and is one the breaker can make.
func (rc *recount) breaker(s *scope, e *auditd.Event) {
	s.counts.Breaker++
	if e.To == breakerOpen {
		s.counts.BreakerOpens++
	}
	c := &s.checks[4] // R5
	c.expected++
	if e.From != s.breaker || !legalTransition(e.From, e.To) {
		c.offend(e.Seq, rc.maxOffending)
	} else {
		c.actual++
	}
	s.breaker = e.To
}

// cacheServed counts an item served from a last good copy and keeps it
// for the report's list of such items.
func (rc *recount) cacheServed(s *scope, e *auditd.Event) {
	s.counts.CacheServed++
	ci := CachedItem{Seq: e.Seq, SourceID: s.id, ItemKey: strings.Clone(e.ItemKey), ServedAt: e.Time.UTC(),
		PayloadHash: strings.Clone(e.PayloadHash), Reason: strings.Clone(e.Reason)}
	// A Detail that does not decode leaves the copy's age unknown.
	if c, err := auditd.ParseCacheDetail(e.Detail); err == nil && c != nil {
		ci.OriginRun, ci.FetchedAt, ci.Age = c.OriginRun, c.FetchedAt.UTC(), c.Age
	}
	rc.cached = append(rc.cached, ci)
}

// acknowledged counts an acknowledgement in its item's scope (e's own when
// the item is unknown) and holds it to R10: it names a delivered item, once.
func (rc *recount) acknowledged(s *scope, e *auditd.Event) {
	rc.hasAck = true
	_, it := rc.item(e.ItemKey)
	if it != nil {
		s = rc.scopes[it.src]
	}
	s.counts.Acknowledged++
	c := &s.checks[9] // R10
	c.actual++
	if it == nil || !it.has(itemFinished) || it.has(itemAcked) || !it.has(itemDelivered) {
		c.offend(e.Seq, rc.maxOffending)
		s.undelivered = append(s.undelivered, keyAt{e.Seq, strings.Clone(e.ItemKey)})
	}
	if it != nil {
		it.flags |= itemAcked
	}
}

// runDetail is run.started's Detail (docs/EVENTS.md).
type runDetail struct {
	Award       auditd.Award `json:"award"`
	ConfigHash  string       `json:"config_hash"`
	CodeVersion string       `json:"code_version"`
	Name        string       `json:"name"`
}

func (rc *recount) runStarted(e *auditd.Event) {
	rc.run.StartedAt = e.Time.UTC()
	rc.run.InitiatedBy = e.Principal
	var d runDetail
	if e.Detail != "" && json.Unmarshal([]byte(e.Detail), &d) == nil {
		rc.run.Award, rc.run.ConfigHash, rc.run.CodeVersion, rc.run.Name = d.Award, d.ConfigHash, d.CodeVersion, d.Name
	}
}

func legalTransition(from, to string) bool {
	switch {
	case from == breakerClosed && to == breakerOpen,
		from == breakerOpen && to == breakerHalfOpen,
		from == breakerHalfOpen && to == breakerClosed,
		from == breakerHalfOpen && to == breakerOpen:
		return true
	}
	return false
}

func (rc *recount) dispatch(s *scope, e *auditd.Event) {
	most := rc.maxOffending
	s.counts.Dispatches++
	for _, i := range []int{1, 2, 4, 8} { // R2, R3, R5, R9 count every dispatch
		s.checks[i].expected++
	}

	// R3: a first attempt, or a retry after a non-final outcome, numbered
	// without gaps, of a request of a queued item that has not finished.
	i, ok := rc.items.find(e.ItemKey)
	if !ok {
		i = rc.items.add(e.ItemKey) // dispatched, never queued: a key for its requests
	}
	it := rc.items.at(i)
	if !it.has(itemQueued) {
		it = nil
	}
	k := reqID{i, e.Page}
	req := rc.reqs[k]
	switch {
	case it == nil || it.has(itemFinished):
		s.checks[2].offend(e.Seq, most)
	case e.Attempt == 1 && req.attempts == 0:
		s.counts.FirstAttempts++
		s.checks[2].actual++
	case e.Attempt == req.attempts+1 && !req.outstanding && req.retryable:
		s.counts.Retries++
		s.checks[2].actual++
	default:
		s.checks[2].offend(e.Seq, most)
	}
	if req.outstanding { // the previous dispatch never got its outcome
		s.checks[1].offend(req.dispatchSeq, most)
	}
	rc.reqs[k] = request{attempts: e.Attempt, dispatchSeq: e.Seq, outstanding: true}
	if it != nil && e.Page > it.maxPage {
		it.maxPage = e.Page
	}

	// R4: the request honoured its throttle's pause wait, and no pause of
	// the source or its group covers this dispatch.
	if a, ok := rc.awaits[i]; ok && it != nil && a.page == e.Page {
		a.src.violated[a.seq] = true
		a.src.checks[3].offend(a.seq, most)
		delete(rc.awaits, i)
	}
	if p := rc.pauseFor(s); p != nil && !e.Time.Before(p.from) && e.Time.Before(p.until) {
		p.src.violated[p.seq] = true
		p.src.checks[3].offend(p.seq, most)
		s.checks[3].offend(e.Seq, most)
	}

	// R5: the breaker allowed it.
	switch {
	case s.breaker == breakerOpen, s.breaker == breakerHalfOpen && !e.Probe:
		s.checks[4].offend(e.Seq, most)
	default:
		s.checks[4].actual++
	}

	// R9: the sliding window (t - window, t] holds no more than limit+burst.
	rc.window(s, e)
}

func (rc *recount) pauseFor(s *scope) *pause {
	key := s.id
	if g := rc.groupOf[s.id]; g != "" {
		key = "group:" + g
	}
	return rc.pauses[key]
}

func (rc *recount) outcome(s *scope, e *auditd.Event) {
	most := rc.maxOffending
	switch e.Type {
	case auditd.EventThrottle:
		s.counts.Throttles++
		s.checks[3].expected++
		if e.Status == 429 {
			s.counts.Status429++
		} else {
			s.counts.Status5xx++
		}
		key := s.id
		if g := rc.groupOf[s.id]; g != "" {
			key = "group:" + g
		}
		until := e.Time.Add(e.Wait)
		if p := rc.pauses[key]; p == nil || !until.Before(p.until) {
			rc.pauses[key] = &pause{from: e.Time, until: until, seq: e.Seq, src: s}
		}
		if i, it := rc.item(e.ItemKey); it != nil {
			rc.awaits[i] = await{seq: e.Seq, page: e.Page, src: s}
		}
	case auditd.EventResponse:
		switch {
		case e.Status >= 200 && e.Status < 300:
			s.counts.Status2xx++
		case e.Status == 429:
			s.counts.Status429++
		case e.Status >= 500 && e.Status < 600:
			s.counts.Status5xx++
		default:
			s.counts.StatusOther++
		}
	case auditd.EventTransportError:
		s.counts.TransportErrors++
	case auditd.EventInterrupted:
		s.counts.Interrupted++
	}
	c := &s.checks[1]
	c.actual++
	i, known := rc.items.find(e.ItemKey)
	k := reqID{i, e.Page}
	req, ok := rc.reqs[k]
	if !known || !ok || !req.outstanding || req.attempts != e.Attempt {
		c.offend(e.Seq, most) // an outcome with no dispatch waiting for it
		return
	}
	req.outstanding = false
	if e.Type == auditd.EventThrottle {
		s.refused(req.dispatchSeq) // R9: the upstream took none of its records
	}
	req.retryable = retryable(e)
	rc.reqs[k] = req
}

// retryable reports whether an outcome leaves its request open to a retry:
// everything except a success and a client error, which are final.
func retryable(e *auditd.Event) bool {
	if e.Type != auditd.EventResponse {
		return true
	}
	return e.Outcome != auditd.OutcomeSuccess && e.Outcome != auditd.OutcomeClientError
}

func (rc *recount) staged(s *scope, e *auditd.Event) {
	_, it := rc.item(e.ItemKey)
	if it != nil {
		s = rc.scopes[it.src]
	}
	s.counts.Staged++
	c := &s.checks[5]
	// The payload is re-hashed once the scan pauses (verifyPayloads), not
	// here inside the ledger scan's read transaction.
	p := pendingPayload{seq: e.Seq, check: c}
	p.hash, p.malformed = decodeSum(e.PayloadHash)
	if it != nil && it.has(itemRestage) && !it.has(itemFinished) {
		// Staged again after a restart: the item still counts once.
		it.flags &^= itemRestage
		it.seq = e.Seq
		rc.addPending(p)
		return
	}
	c.actual++
	p.counted = true
	rc.addPending(p)
	if it == nil || it.has(itemStaged) || it.has(itemFinished) {
		c.offend(e.Seq, rc.maxOffending)
		return
	}
	it.flags |= itemStaged
	it.seq = e.Seq
}

func (rc *recount) itemFinished(s *scope, e *auditd.Event) {
	most := rc.maxOffending
	i, it := rc.item(e.ItemKey)
	if it != nil {
		s = rc.scopes[it.src]
	}
	c := &s.checks[0]
	switch e.Outcome {
	case auditd.ItemSucceeded:
		s.counts.Succeeded++
	case auditd.ItemCached:
		s.counts.Cached++
	case auditd.ItemFailed:
		s.counts.Failed++
	case auditd.ItemShed:
		s.counts.Shed++
	default:
		c.offend(e.Seq, most) // not an item outcome: counts nowhere
		return
	}
	c.actual++
	if it == nil || it.has(itemFinished) {
		c.offend(e.Seq, most)
		return
	}
	if it.has(itemStaged) && e.Outcome != auditd.ItemSucceeded {
		s.checks[5].offend(it.seq, most) // a payload staged for an item that did not succeed
	}
	it.flags |= itemFinished
	it.seq = e.Seq
	switch e.Outcome {
	case auditd.ItemSucceeded:
		it.flags |= itemSucceeded | itemDelivered
	case auditd.ItemCached:
		it.flags |= itemDelivered
	}
	// The item's requests are over: one still waiting for its outcome never
	// got it (R2), and later dispatches offend R3 via the item.
	for p := uint32(0); p <= it.maxPage; p++ {
		k := reqID{i, p}
		if req, ok := rc.reqs[k]; ok && req.outstanding {
			s.checks[1].offend(req.dispatchSeq, most)
		}
		delete(rc.reqs, k)
	}
}
