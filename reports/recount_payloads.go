package reports

import (
	"encoding/hex"
	"errors"

	"github.com/auditd/auditd"
)

// Payloads the recount checks against staging, a batch at a time: the scan
// pauses when pendingBatch are waiting and resumes after them, so that
// they are not all held until its end. Reading the payload store inside
// the ledger scan's read transaction would deadlock once the ledger's
// writer waits to grow the file.

// pendingBatch is how many staged payloads wait for their re-hash at most.
const pendingBatch = 1 << 14

// errPause pauses a scan to re-hash the payloads waiting; it never leaves
// this package.
var errPause = errors.New("pause scan")

// pendingPayload is a staged payload whose hash is checked once the scan
// pauses.
type pendingPayload struct {
	seq       uint64
	hash      [32]byte
	malformed bool   // the recorded hash is not 64 hex digits
	counted   bool   // counted in check.actual
	check     *tally // the scope's R6
}

func (rc *recount) addPending(p pendingPayload) {
	if rc.payloads != nil {
		rc.pending = append(rc.pending, p)
	}
}

func decodeSum(s string) (sum [32]byte, malformed bool) {
	if len(s) != 64 {
		return sum, true
	}
	_, err := hex.Decode(sum[:], []byte(s))
	return sum, err != nil
}

// verifyPayloads re-hashes the staged payloads waiting, in the order the
// scan saw them; one that is missing or altered breaks R6 at its event.
func (rc *recount) verifyPayloads() {
	if rc.payloads == nil {
		return
	}
	for _, p := range rc.pending {
		err := errMalformedSum
		if !p.malformed {
			err = rc.payloads.VerifyPayload(hex.EncodeToString(p.hash[:]))
		}
		if err == nil {
			continue
		}
		if errors.Is(err, auditd.ErrPurged) {
			// Purged under retention: the recorded hash stands, the
			// bytes are lawfully gone.
			rc.purged++
			continue
		}
		if rc.payloadErr == nil {
			rc.payloadErr = err
		}
		if p.counted {
			p.check.actual--
		}
		p.check.offend(p.seq, rc.maxOffending)
	}
	rc.pending = rc.pending[:0]
}

// errMalformedSum is a recorded payload hash that is not a SHA-256 in hex.
var errMalformedSum = errors.New("payload hash is not 64 hex digits")
