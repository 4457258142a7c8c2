package fetch_test

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/auditd/auditd/clock"
)

// recordsUpstream is a gateway that counts records, not requests, as the
// batch-upload seed's does: a POST's body is a JSON array of records, and
// the gateway accepts at most ceiling records in any window (sliding, on
// its clock). A POST that would take it past that is refused with 429 and
// an honest Retry-After: the whole seconds until enough of its window has
// aged out. It remembers every arrival, accepted or not.
type recordsUpstream struct {
	clk     clock.Clock
	ceiling int
	window  time.Duration

	mu       sync.Mutex
	arrivals []recordsArrival
}

type recordsArrival struct {
	at       time.Time
	records  int
	accepted bool
	key      string // the Idempotency-Key the request carried
}

func (u *recordsUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var records []json.RawMessage
	if err != nil || r.Method != http.MethodPost || json.Unmarshal(body, &records) != nil || len(records) == 0 {
		http.Error(w, "a POST of a JSON array of records", http.StatusBadRequest)
		return
	}
	n := len(records)
	u.mu.Lock()
	now := u.clk.Now()
	a := recordsArrival{at: now, records: n, key: r.Header.Get("Idempotency-Key")}
	in, wait := 0, time.Duration(0)
	// Walk the accepted arrivals of the window newest first: the wait is
	// until the oldest of those that must leave has left.
	for i := len(u.arrivals) - 1; i >= 0; i-- {
		p := u.arrivals[i]
		if !p.accepted {
			continue
		}
		if now.Sub(p.at) >= u.window {
			break
		}
		in += p.records
		if in+n > u.ceiling && wait == 0 {
			wait = p.at.Add(u.window).Sub(now)
		}
	}
	a.accepted = in+n <= u.ceiling
	u.arrivals = append(u.arrivals, a)
	u.mu.Unlock()
	if !a.accepted {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
		http.Error(w, fmt.Sprintf("%d records would pass %d per %v", n, u.ceiling, u.window), http.StatusTooManyRequests)
		return
	}
	fmt.Fprintf(w, `{"accepted":%d}`, n)
}

// snapshot returns every arrival so far, oldest first.
func (u *recordsUpstream) snapshot() []recordsArrival {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]recordsArrival(nil), u.arrivals...)
}

// busiest returns the most records that arrived (accepted or not) in any
// window of the upstream's length.
func busiest(arrivals []recordsArrival, window time.Duration) int {
	most, sum, j := 0, 0, 0
	for _, a := range arrivals {
		sum += a.records
		for a.at.Sub(arrivals[j].at) >= window {
			sum -= arrivals[j].records
			j++
		}
		most = max(most, sum)
	}
	return most
}

// recordsBody is a JSON array of n records.
func recordsBody(n int, tag string) []byte {
	b := []byte{'['}
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, `{"id":"%s-%d"}`, tag, i)
	}
	return append(b, ']')
}
