package fetch

import "github.com/auditd/auditd"

// Counts are a run's live counters, kept while it runs and saved with it.
// Reconciliation (R7) compares them with a fresh recount of the ledger.
type Counts struct {
	Items     int `json:"items"`
	Succeeded int `json:"succeeded"`
	Cached    int `json:"cached"`
	Failed    int `json:"failed"`
	Shed      int `json:"shed"`

	Dispatches      int `json:"dispatches"`
	Retries         int `json:"retries"`
	Status2xx       int `json:"status_2xx"`
	Status429       int `json:"status_429"`
	Status5xx       int `json:"status_5xx"`
	StatusOther     int `json:"status_other"`
	TransportErrors int `json:"transport_errors"`
	Interrupted     int `json:"interrupted"`
	Waits           int `json:"waits"`
	BreakerOpens    int `json:"breaker_opens"`
	Staged          int `json:"staged"`
	Acknowledged    int `json:"acknowledged"`

	// BySource counts items per source, for progress and the finish estimate.
	BySource map[string]*SourceProgress `json:"by_source,omitempty"`
}

// SourceProgress is one source's share of a run.
type SourceProgress struct {
	Items int `json:"items"`
	Done  int `json:"done"`
}

// Done is how many items have finished.
func (c *Counts) Done() int { return c.Succeeded + c.Cached + c.Failed + c.Shed }

// Pending is how many items have not finished.
func (c *Counts) Pending() int { return c.Items - c.Done() }

// count updates the counters for one appended event. It is the only place
// counters change, so they mean exactly what the events say.
func (c *Counts) count(e *auditd.Event) {
	switch e.Type {
	case auditd.EventItemQueued:
		c.Items++
		c.source(e.SourceID).Items++
	case auditd.EventDispatch:
		c.Dispatches++
		if e.Attempt > 1 {
			c.Retries++
		}
	case auditd.EventResponse, auditd.EventThrottle:
		switch {
		case e.Status >= 200 && e.Status < 300:
			c.Status2xx++
		case e.Status == 429:
			c.Status429++
		case e.Status >= 500 && e.Status < 600:
			c.Status5xx++
		default:
			c.StatusOther++
		}
	case auditd.EventTransportError:
		c.TransportErrors++
	case auditd.EventInterrupted:
		c.Interrupted++
	case auditd.EventWait:
		c.Waits++
	case auditd.EventBreaker:
		if e.To == "open" {
			c.BreakerOpens++
		}
	case auditd.EventPayloadStaged:
		c.Staged++
	case auditd.EventAcknowledged:
		c.Acknowledged++
	case auditd.EventItemFinished:
		c.source(e.SourceID).Done++
		switch e.Outcome {
		case auditd.ItemSucceeded:
			c.Succeeded++
		case auditd.ItemCached:
			c.Cached++
		case auditd.ItemFailed:
			c.Failed++
		case auditd.ItemShed:
			c.Shed++
		}
	}
}

func (c *Counts) source(id string) *SourceProgress {
	if c.BySource == nil {
		c.BySource = map[string]*SourceProgress{}
	}
	p := c.BySource[id]
	if p == nil {
		p = &SourceProgress{}
		c.BySource[id] = p
	}
	return p
}

func (c *Counts) clone() Counts {
	out := *c
	out.BySource = make(map[string]*SourceProgress, len(c.BySource))
	for k, v := range c.BySource {
		p := *v
		out.BySource[k] = &p
	}
	return out
}
