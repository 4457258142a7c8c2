package auditd

// Counts are a run's counters. The fetch loop counts each of the run's
// events once it is durable (Count), the runs store keeps them with the
// run, the API shows them, and reconciliation (R7) compares them with a
// recount of the ledger of its own.
type Counts struct {
	Items     int `json:"items"` // item.queued
	Succeeded int `json:"succeeded"`
	Cached    int `json:"cached"`
	Failed    int `json:"failed"`
	Shed      int `json:"shed"`
	Pending   int `json:"pending"` // queued and not finished

	Dispatches      int `json:"dispatches"`
	Retries         int `json:"retries"` // dispatches after a request's first
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

// SourceProgress is one source's share of a run's items.
type SourceProgress struct {
	Items int `json:"items"`
	Done  int `json:"done"`
}

// Done is how many items have finished.
func (c *Counts) Done() int { return c.Succeeded + c.Cached + c.Failed + c.Shed }

// Count counts one of the run's events. It is the only place the counters
// change, so they mean exactly what the events say.
func (c *Counts) Count(e *Event) {
	switch e.Type {
	case EventItemQueued:
		c.Items++
		c.Pending++
		c.source(e.SourceID).Items++
	case EventDispatch:
		c.Dispatches++
		if e.Attempt > 1 {
			c.Retries++
		}
	case EventResponse, EventThrottle:
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
	case EventTransportError:
		c.TransportErrors++
	case EventInterrupted:
		c.Interrupted++
	case EventWait:
		c.Waits++
	case EventBreaker:
		if e.To == "open" {
			c.BreakerOpens++
		}
	case EventPayloadStaged:
		c.Staged++
	case EventAcknowledged:
		c.Acknowledged++
	case EventItemFinished:
		c.Pending--
		c.source(e.SourceID).Done++
		switch e.Outcome {
		case ItemSucceeded:
			c.Succeeded++
		case ItemCached:
			c.Cached++
		case ItemFailed:
			c.Failed++
		case ItemShed:
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

// Clone returns a copy of c that shares nothing with it.
func (c *Counts) Clone() Counts {
	out := *c
	if c.BySource != nil {
		out.BySource = make(map[string]*SourceProgress, len(c.BySource))
		for id, p := range c.BySource {
			q := *p
			out.BySource[id] = &q
		}
	}
	return out
}
