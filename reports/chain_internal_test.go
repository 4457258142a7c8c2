package reports

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/auditd/auditd"
)

// seqReader is a ledger whose events belong to run "r" at the given seqs
// and to run "other" elsewhere.
type seqReader []uint64

func (s seqReader) ScanRun(runID string, after uint64, fn func(*auditd.Event) error) error {
	if runID != "r" {
		return nil
	}
	for _, seq := range s {
		if seq > after {
			if err := fn(&auditd.Event{Seq: seq, RunID: runID}); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s seqReader) Scan(from, to uint64, fn func(*auditd.Event) error) error { return nil }

func TestRunRange(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	cases := map[string][]uint64{
		"Empty":    nil,
		"One":      {7},
		"Dense":    {1, 2, 3, 4, 5},
		"Sparse":   {3, 90, 91, 5000, 123456},
		"HugeSeqs": {1 << 40, 1<<62 + 5, 1<<63 + 9},
	}
	for i := range 20 {
		var seqs []uint64
		for seq := uint64(1 + rng.IntN(50)); len(seqs) < 1+rng.IntN(300); seq += uint64(1 + rng.IntN(1000)) {
			seqs = append(seqs, seq)
		}
		cases["Random"+string(rune('A'+i))] = seqs
	}
	for name, seqs := range cases {
		t.Run(name, func(t *testing.T) {
			first, last, err := runRange(seqReader(seqs), "r")
			if err != nil {
				t.Fatal(err)
			}
			var wantFirst, wantLast uint64
			if len(seqs) > 0 {
				wantFirst, wantLast = seqs[0], slices.Max(seqs)
			}
			if first != wantFirst || last != wantLast {
				t.Errorf("runRange = %d..%d, want %d..%d", first, last, wantFirst, wantLast)
			}
		})
	}
}
