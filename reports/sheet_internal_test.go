package reports

import (
	"testing"
	"time"
)

func TestAppendTime(t *testing.T) {
	for _, tm := range []time.Time{
		time.Date(2026, 3, 2, 10, 0, 0, 150e6, time.UTC),
		time.Date(1999, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(2026, 1, 1, 0, 0, 0, 1, time.FixedZone("EST", -5*3600)),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
	} {
		if got, want := string(appendTime(nil, tm)), tm.UTC().Format(timeLayout); got != want {
			t.Errorf("appendTime(%v) = %s, want %s", tm, got, want)
		}
	}
}
