package reports

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/auditd/auditd"
)

// SheetRetention is the population of the retention events of the
// exported runs' awards: retention dates, legal holds placed and
// released, payloads purged (2 CFR 200.334). Written when the Exporter
// has a Retention source.
const SheetRetention = "Retention"

var specRetention = sheetSpec{SheetRetention, []column{{"Seq", 10}, {"Time", 26}, {"Event", 16}, {"Award", 18},
	{"Who", 28}, {"Reason", 40}, {"Final report", 12}, {"Retain until", 12}, {"Hold", 10}, {"Run", 30},
	{"Payloads purged", 10}, {"Bytes purged", 12}, {"Event hash", 66}}}

// RetentionSource gives the retention events of awards in sequence
// order. *retention.Keeper provides it.
type RetentionSource interface {
	Events(awards []string, fn func(*auditd.Event) error) error
}

// retentionDetail is the Detail of the retention events (retention
// package).
type retentionDetail struct {
	Award       string   `json:"award"`
	FinalReport string   `json:"final_report"`
	RetainUntil string   `json:"retain_until"`
	Hold        string   `json:"hold"`
	Run         string   `json:"run"`
	Payloads    []string `json:"payloads"`
}

// runAwards returns the awards (FAINs) of the runs, from each range's
// first event (run.started), sorted.
func runAwards(events auditd.EventReader, ranges [][2]uint64) ([]string, error) {
	var out []string
	for _, r := range ranges {
		err := events.Scan(r[0], r[0], func(e *auditd.Event) error {
			if e.Type != auditd.EventRunStarted {
				return nil
			}
			var d runDetail
			if json.Unmarshal([]byte(e.Detail), &d) == nil && d.Award.FAIN != "" && !slices.Contains(out, d.Award.FAIN) {
				out = append(out, d.Award.FAIN)
			}
			return errStop
		})
		if err != nil && !errors.Is(err, errStop) {
			return nil, err
		}
	}
	slices.Sort(out)
	return out, nil
}

// retentionEvents collects the retention events of the runs' awards.
func retentionEvents(src RetentionSource, events auditd.EventReader, ranges [][2]uint64) ([]auditd.Event, error) {
	if src == nil {
		return nil, nil
	}
	awards, err := runAwards(events, ranges)
	if err != nil || len(awards) == 0 {
		return nil, err
	}
	var out []auditd.Event
	err = src.Events(awards, func(e *auditd.Event) error {
		out = append(out, *e)
		return nil
	})
	return out, err
}

// retentionRows writes the Retention rows of evs and, for the holds and
// purges (who did what to the records), Access log rows after the runs'.
func retentionRows(evs []auditd.Event, retention, access rowWriter) error {
	for i := range evs {
		e := &evs[i]
		var d retentionDetail
		json.Unmarshal([]byte(e.Detail), &d)
		var payloads, bytes any
		if e.Type == auditd.EventPayloadPurged {
			payloads, bytes = len(d.Payloads), e.Bytes
		}
		if err := retention.row(e.Seq, e.Time, string(e.Type), d.Award, e.Principal, e.Reason, d.FinalReport, d.RetainUntil,
			d.Hold, d.Run, payloads, bytes, hexHash(e.Hash)); err != nil {
			return err
		}
		var what string
		switch e.Type {
		case auditd.EventHoldPlaced:
			what = fmt.Sprintf("placed a legal hold on award %s: %s", d.Award, e.Reason)
		case auditd.EventHoldReleased:
			what = fmt.Sprintf("released legal hold %s on award %s: %s", d.Hold, d.Award, e.Reason)
		case auditd.EventPayloadPurged:
			what = fmt.Sprintf("purged %d staged payloads of award %s under retention", len(d.Payloads), d.Award)
		default:
			continue
		}
		if err := access.row(e.Seq, d.Run, e.Time, e.Principal, what, nil, hexHash(e.Hash)); err != nil {
			return err
		}
	}
	return nil
}
