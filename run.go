package auditd

import (
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"time"
)

// Outcome classifies a response, an item or a run.
type Outcome string

// Outcomes of a single response.
const (
	OutcomeSuccess     Outcome = "success"      // 2xx with no error in the body
	OutcomeThrottled   Outcome = "throttled"    // 429, or 503 with Retry-After
	OutcomeServerError Outcome = "server_error" // other 5xx
	OutcomeClientError Outcome = "client_error" // 4xx other than 429
	OutcomeBodyError   Outcome = "body_error"   // 2xx whose body carries an error (Grants.gov errorcode, ArcGIS 498)
)

// Outcomes of an item (item.finished).
const (
	ItemSucceeded Outcome = "succeeded"
	ItemCached    Outcome = "cached" // served from the last good staged copy
	ItemFailed    Outcome = "failed"
	ItemShed      Outcome = "shed"
)

// RunStatus is where a run is in its life.
type RunStatus string

// Run statuses. A run always reaches a terminal status.
const (
	RunQueued    RunStatus = "queued"
	RunRunning   RunStatus = "running"
	RunSucceeded RunStatus = "succeeded" // every item succeeded or was served from cache
	RunPartial   RunStatus = "partial"   // finished, some items failed or were shed
	RunCancelled RunStatus = "cancelled"
)

// Terminal reports whether no more work will happen for a run in status s.
func (s RunStatus) Terminal() bool {
	return s == RunSucceeded || s == RunPartial || s == RunCancelled
}

// Award identifies the federal award a run supports (2 CFR 200.302(b)(1)).
// Every field is optional but validated when present.
type Award struct {
	FAIN               string `json:"fain,omitempty" validate:"omitempty,max=64,printascii"`
	ListingNumber      string `json:"listing_number,omitempty" validate:"omitempty,len=6,listing"` // Assistance Listing, NN.NNN
	ListingTitle       string `json:"listing_title,omitempty" validate:"omitempty,max=256"`
	AwardYear          int    `json:"award_year,omitempty" validate:"omitempty,min=1990,max=2100"`
	Agency             string `json:"agency,omitempty" validate:"omitempty,max=256"`
	PassThroughEntity  string `json:"pass_through_entity,omitempty" validate:"omitempty,max=256"`
	PassThroughAwardID string `json:"pass_through_award_id,omitempty" validate:"omitempty,max=64"`
	RecipientUEI       string `json:"recipient_uei,omitempty" validate:"omitempty,len=12,alphanum,uppercase"`
}

// RunMode says how a run's items come: all at once with the run (batch),
// or one per request a pipeline sends through the proxy route (proxy).
type RunMode string

// Run modes.
const (
	RunBatch RunMode = ""      // items submitted with the run; the loop fetches them
	RunProxy RunMode = "proxy" // no items up front: each proxied request becomes one
)

// DefaultIdleTimeout ends a proxy-mode run that has seen no request for
// this long.
const DefaultIdleTimeout = 15 * time.Minute

// Run is a named list of fetches submitted by a pipeline.
type Run struct {
	ID          string    `json:"id"` // ULID: sortable by creation time
	Name        string    `json:"name"`
	Award       Award     `json:"award"`
	Status      RunStatus `json:"status"`
	InitiatedBy string    `json:"initiated_by"`
	ConfigHash  string    `json:"config_hash"`
	CodeVersion string    `json:"code_version"`
	CreatedAt   time.Time `json:"created_at"`
	FinishedAt  time.Time `json:"finished_at,omitzero"`
	Deadline    time.Time `json:"deadline,omitzero"`
	Replay      bool      `json:"replay,omitempty"` // read staged payloads instead of re-fetching
	FirstSeq    uint64    `json:"first_seq"`
	LastSeq     uint64    `json:"last_seq,omitempty"`
	HeadAtStart string    `json:"head_at_start"`
	HeadAtEnd   string    `json:"head_at_end,omitempty"`
	ItemCount   int       `json:"item_count"`
	// Mode is RunProxy for a run whose items are proxied requests;
	// IdleTimeout then ends it after that long without one, and an open
	// batch run after that long without a page.
	Mode        RunMode  `json:"mode,omitempty"`
	IdleTimeout Duration `json:"idle_timeout,omitempty"`
	// Open is true while a batch run takes more pages of items (POST
	// /v1/runs/{id}/items); it ends once finished and its items have.
	Open bool `json:"open,omitempty"`
}

// Paging names how an item expands into pages.
type Paging string

// Paging modes; empty means a single request.
const (
	PagingNone      Paging = ""
	PagingArcGIS    Paging = "arcgis"     // resultOffset / resultRecordCount / exceededTransferLimit
	PagingWFS       Paging = "wfs"        // startIndex / count / numberMatched
	PagingGrantsGov Paging = "grants_gov" // startRecordNum / rows / hitCount
)

// Item is one fetch in a run. Its key is unique in the run and is the
// idempotency key of everything recorded for it.
type Item struct {
	Key      string `json:"key" validate:"required,max=200,printascii"`
	SourceID string `json:"source" validate:"required,max=100,printascii"`
	Method   string `json:"method,omitempty" validate:"omitempty,oneof=GET POST"`
	// Path is sent after the source's base URL; itempath is ValidPath.
	Path     string `json:"path" validate:"required,max=4096,startswith=/,itempath"`
	Body     []byte `json:"body,omitempty"` // JSON body for POST
	Paging   Paging `json:"paging,omitempty" validate:"omitempty,oneof=arcgis wfs grants_gov"`
	PageSize int    `json:"page_size,omitempty" validate:"omitempty,min=1,max=10000"`
	// Cost is what each of the item's requests spends of its source's
	// budget: the records it carries. Zero means 1.
	Cost int `json:"cost,omitempty" validate:"omitempty,min=1,max=1000000"`
	// SendPath is the path as it is sent upstream, when Path is it with
	// credentials redacted (the fetch loop splits them when the item is
	// submitted). It lives in memory and, sealed, with the run until the
	// run ends; it is never encoded, shown or recorded.
	SendPath string `json:"-" yaml:"-"`
}

// ValidPath reports whether p can be an item's path: it starts with "/",
// parses as a request target, and holds no control character, space or
// fragment, which no request line can carry (a fragment is never sent).
// Characters past ASCII are allowed; they are sent percent-encoded in the
// path and as UTF-8 in the query.
func ValidPath(p string) bool {
	if !strings.HasPrefix(p, "/") {
		return false
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; c <= ' ' || c == 0x7f || c == '#' {
			return false
		}
	}
	_, err := url.ParseRequestURI(p)
	return err == nil
}

// ItemResult is how an item ended.
type ItemResult struct {
	Outcome     Outcome `json:"outcome"`
	Reason      string  `json:"reason,omitempty"` // why it failed, was shed or served from cache
	PayloadHash string  `json:"payload_hash,omitempty"`
	Bytes       int64   `json:"bytes,omitempty"`
	Attempts    int     `json:"attempts"` // dispatches of all its pages
	Pages       int     `json:"pages,omitempty"`
	Records     int     `json:"records,omitempty"`
	// Advertised is the upstream's own total for a paged item, -1 when it
	// gives none; CountMatched says whether the records fetched equal it.
	Advertised   int  `json:"advertised,omitempty"`
	CountMatched bool `json:"count_matched,omitempty"`
	// Cached is the copy a cached item was served from; nil otherwise.
	Cached *CachedCopy `json:"cached,omitempty"`
}

// CachedCopy is the last good copy an item was served from: which run
// fetched it, when, and how old it was when it was served. cache.served
// carries it as its Detail (CacheDetail).
type CachedCopy struct {
	// OriginRun is the run that fetched the copy; empty when the copy was
	// indexed before the index recorded runs.
	OriginRun string    `json:"origin_run,omitempty"`
	FetchedAt time.Time `json:"fetched_at"`
	Age       Duration  `json:"age"` // from FetchedAt to when it was served
}

// CacheDetail is c as cache.served's Detail holds it: JSON.
func (c CachedCopy) CacheDetail() string {
	b, _ := json.Marshal(c)
	return string(b)
}

// ParseCacheDetail reads a cache.served's Detail; nil for an event
// recorded before cache.served said where its copy came from.
func ParseCacheDetail(detail string) (*CachedCopy, error) {
	if detail == "" {
		return nil, nil
	}
	var c CachedCopy
	if err := json.Unmarshal([]byte(detail), &c); err != nil {
		return nil, Errorf(EINVALID, "cache.served detail: %v", err)
	}
	return &c, nil
}

// NewRun is a run to create, as a pipeline submits it.
type NewRun struct {
	// ID is the id of a fleet run's part on this node: the id every node
	// knows the run by. Empty for any other run: its id is minted.
	ID             string
	Name           string
	Award          Award
	Items          []Item
	Deadline       time.Time     // zero: none; past it, unfinished items are shed
	Replay         bool          // read staged payloads instead of re-fetching
	IdempotencyKey string        // a second submit with the same key returns the first run
	Principal      string        // who submitted it
	Mode           RunMode       // RunProxy: no Items; requests through the proxy route become them
	IdleTimeout    time.Duration // a proxy run ends after this long without a request (0: DefaultIdleTimeout), an open batch run after this long without a page (0: the loop's default)
	Open           bool          // a batch run that takes more pages of items until it is finished
}

// RunView is a run as its readers see it: the stored run, its counters
// (live while it runs), and an estimate of when it will finish.
type RunView struct {
	Run
	Counts Counts `json:"counts"`
	// EstimatedFinish is computed from each source's pace and the items
	// still queued for it; zero once the run is finished or when unknown.
	EstimatedFinish time.Time `json:"estimated_finish,omitzero"`
	// Paused says why a running run dispatches nothing for now, and
	// since when: its records cannot be written (the disk is full, say),
	// and no request leaves before its dispatch is on record. Nil while
	// it runs, and once it has ended.
	Paused *Pause `json:"paused,omitempty"`
}

// Pause is why, and since when, a run dispatches nothing for now.
type Pause struct {
	Since  time.Time `json:"since"`
	Reason string    `json:"reason"`
}

// ItemView is an item with how it ended; Result is nil while it is pending.
type ItemView struct {
	Item
	Result *ItemResult `json:"result,omitempty"`
}

// RunFilter selects runs. Zero fields match everything.
type RunFilter struct {
	Status RunStatus
	Source string
	FAIN   string
	From   time.Time // created at or after
	To     time.Time // created before
	After  string    // cursor: the id of the last run of the previous page
	Limit  int
}

// AwardPeriod says in words which runs of an award an export or pack of
// the period covers, as they name their filters: "award=F from=T to=T",
// each time RFC 3339 UTC or "-" when open.
func (f RunFilter) AwardPeriod() string {
	stamp := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format(time.RFC3339)
	}
	return "award=" + f.FAIN + " from=" + stamp(f.From) + " to=" + stamp(f.To)
}

// RunLister pages through runs (the run store).
type RunLister interface {
	Runs(ctx context.Context, f RunFilter) (runs []RunView, next string, err error)
}

// EachRun calls fn for every run f selects, page after page, newest first
// as the store lists them; an error from fn ends the walk.
func EachRun(ctx context.Context, l RunLister, f RunFilter, fn func(RunView) error) error {
	for {
		runs, next, err := l.Runs(ctx, f)
		if err != nil {
			return err
		}
		for _, r := range runs {
			if err := fn(r); err != nil {
				return err
			}
		}
		if next == "" {
			return nil
		}
		f.After = next
	}
}
