package ledger

import (
	"testing"
	"time"
)

// lingerFor lets a commit group wait for more appends only while the ledger
// is busy, and never past 1.5 times the last commit's time, nor GroupDelay,
// since the last group was sealed.
func TestLingerFor(t *testing.T) {
	l := &Ledger{maxGroup: 64, groupDelay: time.Hour}
	small := &batch{events: 15}
	sealed := time.Now()
	cases := []struct {
		name   string
		b      *batch
		busy   bool
		sealed time.Time
		took   time.Duration // the last commit's time
		closed bool
		want   func(time.Duration) bool
	}{
		{"Idle", small, false, sealed, time.Hour, false, func(d time.Duration) bool { return d <= 0 }},
		{"Busy", small, true, sealed, time.Hour, false, func(d time.Duration) bool { return d > 59*time.Minute && d <= time.Hour }},
		{"BusyFastDisk", small, true, sealed, 10 * time.Minute, false, func(d time.Duration) bool { return d > 14*time.Minute && d <= 15*time.Minute }},
		{"BusyCommitsPassed", small, true, sealed.Add(-15 * time.Minute), 10 * time.Minute, false, func(d time.Duration) bool { return d <= 0 }},
		{"BusyLongAgo", small, true, sealed.Add(-2 * time.Hour), time.Hour, false, func(d time.Duration) bool { return d <= 0 }},
		{"QuarterFull", &batch{events: 16}, true, sealed, time.Hour, false, func(d time.Duration) bool { return d <= 0 }},
		{"Closing", small, true, sealed, time.Hour, true, func(d time.Duration) bool { return d <= 0 }},
	}
	for _, c := range cases {
		if got := l.lingerFor(c.b, c.busy, c.sealed, c.took, c.closed); !c.want(got) {
			t.Errorf("%s: lingerFor = %v", c.name, got)
		}
	}
	off := &Ledger{maxGroup: 64, groupDelay: -1}
	if got := off.lingerFor(small, true, sealed, time.Hour, false); got > 0 {
		t.Errorf("GroupDelay off: lingerFor = %v", got)
	}
}
