package ledger

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/auditd/auditd"
)

// codecVersion is the first byte of every canonical encoding. A change that
// alters the bytes of an existing event needs a new version; adding a field
// with a new tag does not, because zero fields are never written.
const codecVersion = 1

// MaxEventSize bounds the canonical encoding of one event. It keeps one
// runaway Detail from bloating a commit group; the fetch loop's largest
// events (run.started with an award) are well under 4 KiB.
const MaxEventSize = 1 << 20

// Field tags of the canonical encoding, in the order they are written. A tag
// is never reused or renumbered: that would change what stored hashes mean.
const (
	tagSeq = iota + 1
	tagType
	tagRunID
	tagSourceID
	tagItemKey
	tagPage
	tagAttempt
	tagTime
	tagMono
	tagIdempotencyKey
	tagMethod
	tagPath
	tagStatus
	tagBytes
	tagLatency
	tagWait
	tagActual
	tagRetryAfterRaw
	tagRetryAfter
	tagClamped
	tagBackoff
	tagFrom
	tagTo
	tagFailures
	tagThreshold
	tagCooldown
	tagOldLimit
	tagNewLimit
	tagOldWindow
	tagNewWindow
	tagGroup
	tagOutcome
	tagBodyError
	tagPayloadHash
	tagCause
	tagPrincipal
	tagDetail
	tagMax = tagDetail
)

// MarshalCanonical appends the canonical encoding of e to b and returns it.
// PrevHash and Hash are not part of it: they are computed over it. The
// typed fields that share a tag across event types are written as
// auditd.Event.Shared gives them.
func MarshalCanonical(b []byte, e *auditd.Event) []byte {
	attempt, cause := e.Shared()
	b = append(b, codecVersion)
	b = putUint(b, tagSeq, e.Seq)
	b = putString(b, tagType, string(e.Type))
	b = putString(b, tagRunID, e.RunID)
	b = putString(b, tagSourceID, e.SourceID)
	b = putString(b, tagItemKey, e.ItemKey)
	b = putUint(b, tagPage, uint64(e.Page))
	b = putUint(b, tagAttempt, uint64(attempt))
	if !e.Time.IsZero() {
		// Written even when it is the Unix epoch (value 0): presence, not
		// value, says the time is set.
		b = append(b, tagTime)
		b = binary.AppendVarint(b, e.Time.UnixNano())
	}
	b = putInt(b, tagMono, int64(e.Mono))
	b = putString(b, tagIdempotencyKey, e.IdempotencyKey)
	b = putString(b, tagMethod, e.Method)
	b = putString(b, tagPath, e.Path)
	b = putInt(b, tagStatus, int64(e.Status))
	b = putInt(b, tagBytes, e.Bytes)
	b = putInt(b, tagLatency, int64(e.Latency))
	b = putInt(b, tagWait, int64(e.Wait))
	b = putInt(b, tagActual, int64(e.Actual))
	b = putString(b, tagRetryAfterRaw, e.RetryAfterRaw)
	b = putInt(b, tagRetryAfter, int64(e.RetryAfter))
	if e.Clamped {
		b = append(b, tagClamped)
	}
	b = putInt(b, tagBackoff, int64(e.Backoff))
	b = putString(b, tagFrom, e.From)
	b = putString(b, tagTo, e.To)
	b = putInt(b, tagFailures, int64(e.Failures))
	b = putInt(b, tagThreshold, int64(e.Threshold))
	b = putInt(b, tagCooldown, int64(e.Cooldown))
	b = putInt(b, tagOldLimit, int64(e.OldLimit))
	b = putInt(b, tagNewLimit, int64(e.NewLimit))
	b = putInt(b, tagOldWindow, int64(e.OldWindow))
	b = putInt(b, tagNewWindow, int64(e.NewWindow))
	b = putString(b, tagGroup, e.Group)
	b = putString(b, tagOutcome, string(e.Outcome))
	b = putString(b, tagBodyError, e.BodyError)
	b = putString(b, tagPayloadHash, e.PayloadHash)
	b = putString(b, tagCause, cause)
	b = putString(b, tagPrincipal, e.Principal)
	b = putString(b, tagDetail, e.Detail)
	return b
}

func putUint(b []byte, tag byte, v uint64) []byte {
	if v == 0 {
		return b
	}
	return binary.AppendUvarint(append(b, tag), v)
}

func putInt(b []byte, tag byte, v int64) []byte {
	if v == 0 {
		return b
	}
	return binary.AppendVarint(append(b, tag), v)
}

func putString(b []byte, tag byte, s string) []byte {
	if s == "" {
		return b
	}
	b = binary.AppendUvarint(append(b, tag), uint64(len(s)))
	return append(b, s...)
}

// UnmarshalCanonical decodes a canonical encoding into e, which it resets
// first; PrevHash and Hash are left zero. It accepts exactly the bytes
// MarshalCanonical produces: fields in tag order, each at most once, no zero
// values, minimal varints, nothing after the last field, and a cause the
// event's type can hold. So decoding and re-encoding any accepted input
// gives back the same bytes, and the same event can never hash two ways.
//
// It is over a hundred lines on purpose: its switch is the codec's field
// table, run once per field of every event a scan decodes, and moving the
// table into a method called per field made BenchmarkScan1M 18% slower.
func UnmarshalCanonical(b []byte, e *auditd.Event) error {
	return unmarshalCanonical(b, e, nil)
}

// unmarshalCanonical is UnmarshalCanonical taking the strings it decodes
// from st when st holds them (nil: every string is allocated).
func unmarshalCanonical(b []byte, e *auditd.Event, st *stringTable) error {
	*e = auditd.Event{}
	if len(b) > MaxEventSize {
		return fmt.Errorf("%w: %d bytes, more than %d", ErrCorrupt, len(b), MaxEventSize)
	}
	if len(b) == 0 || b[0] != codecVersion {
		return fmt.Errorf("%w: unknown encoding version", ErrCorrupt)
	}
	d := decoder{b: b, i: 1, st: st}
	last := byte(0)
	var attempt uint32 // the fields shared across types (auditd.Event.SetShared)
	var cause string
	for d.i < len(d.b) {
		tag := d.b[d.i]
		d.i++
		if tag <= last || tag > tagMax {
			return fmt.Errorf("%w: field tag %d at offset %d out of order or unknown", ErrCorrupt, tag, d.i-1)
		}
		last, d.tag = tag, tag
		switch tag {
		case tagSeq:
			e.Seq = d.uint()
		case tagType:
			e.Type = auditd.EventType(d.string())
		case tagRunID:
			e.RunID = d.string()
		case tagSourceID:
			e.SourceID = d.string()
		case tagItemKey:
			e.ItemKey = d.string()
		case tagPage:
			e.Page = d.uint32()
		case tagAttempt:
			attempt = d.uint32()
		case tagTime:
			e.Time = time.Unix(0, d.varint(true)).UTC()
		case tagMono:
			e.Mono = time.Duration(d.int())
		case tagIdempotencyKey:
			e.IdempotencyKey = d.string()
		case tagMethod:
			e.Method = d.string()
		case tagPath:
			e.Path = d.string()
		case tagStatus:
			e.Status = int(d.int())
		case tagBytes:
			e.Bytes = d.int()
		case tagLatency:
			e.Latency = time.Duration(d.int())
		case tagWait:
			e.Wait = time.Duration(d.int())
		case tagActual:
			e.Actual = time.Duration(d.int())
		case tagRetryAfterRaw:
			e.RetryAfterRaw = d.string()
		case tagRetryAfter:
			e.RetryAfter = time.Duration(d.int())
		case tagClamped:
			e.Clamped = true
		case tagBackoff:
			e.Backoff = time.Duration(d.int())
		case tagFrom:
			e.From = d.string()
		case tagTo:
			e.To = d.string()
		case tagFailures:
			e.Failures = int(d.int())
		case tagThreshold:
			e.Threshold = int(d.int())
		case tagCooldown:
			e.Cooldown = time.Duration(d.int())
		case tagOldLimit:
			e.OldLimit = int(d.int())
		case tagNewLimit:
			e.NewLimit = int(d.int())
		case tagOldWindow:
			e.OldWindow = time.Duration(d.int())
		case tagNewWindow:
			e.NewWindow = time.Duration(d.int())
		case tagGroup:
			e.Group = d.string()
		case tagOutcome:
			e.Outcome = auditd.Outcome(d.string())
		case tagBodyError:
			e.BodyError = d.string()
		case tagPayloadHash:
			e.PayloadHash = d.string()
		case tagCause:
			cause = d.string()
		case tagPrincipal:
			e.Principal = d.string()
		case tagDetail:
			e.Detail = d.string()
		}
		if d.err != "" {
			return fmt.Errorf("%w: field tag %d: %s", ErrCorrupt, tag, d.err)
		}
	}
	if err := e.SetShared(attempt, cause); err != nil {
		return fmt.Errorf("%w: %s", ErrCorrupt, auditd.ErrorMessage(err))
	}
	return nil
}

// decoder reads one field value at a time; the first problem sticks in err
// so the field switch stays flat.
type decoder struct {
	b   []byte
	i   int
	err string
	tag byte         // the field being read
	st  *stringTable // nil: strings are allocated
}

func (d *decoder) uint() uint64 {
	v, n := binary.Uvarint(d.b[d.i:])
	switch {
	case n <= 0:
		d.err = "bad uvarint"
	case v == 0:
		d.err = "zero value written"
	case n != uvarintLen(v):
		d.err = "non-minimal uvarint"
	}
	d.i += max(n, 0)
	return v
}

func (d *decoder) uint32() uint32 {
	v := d.uint()
	if v > math.MaxUint32 {
		d.err = "value overflows uint32"
	}
	return uint32(v)
}

func (d *decoder) int() int64 { return d.varint(false) }

// varint reads a zigzag varint; zeroOK is for fields whose presence, not
// value, carries meaning.
func (d *decoder) varint(zeroOK bool) int64 {
	v, n := binary.Varint(d.b[d.i:])
	switch {
	case n <= 0:
		d.err = "bad varint"
	case v == 0 && !zeroOK:
		d.err = "zero value written"
	case n != varintLen(v):
		d.err = "non-minimal varint"
	}
	d.i += max(n, 0)
	return v
}

func (d *decoder) string() string {
	n := d.uint()
	if d.err != "" {
		return ""
	}
	if n > uint64(len(d.b)-d.i) {
		d.err = "string runs past the end"
		return ""
	}
	s := d.st.get(d.tag, d.b[d.i:d.i+int(n)])
	d.i += int(n)
	return s
}

// stringTable gives a scan the strings it decodes again and again (event
// types, run and source ids, methods, outcomes) without allocating each
// one anew: it keeps each field's last few
// values and hands one back when the bytes match. They are ordinary heap
// strings, safe to keep. Allocating them was a third of the decode's time
// in BenchmarkScan1M.
type stringTable struct {
	recent [tagMax + 1][8]string
	next   [tagMax + 1]uint8
}

// get returns b as a string, from the table when tag's recent values hold
// it; only fields with few distinct values are looked up.
func (st *stringTable) get(tag byte, b []byte) string {
	if st == nil {
		return string(b)
	}
	switch tag {
	case tagRunID, tagSourceID, tagMethod, tagFrom, tagTo, tagGroup, tagOutcome, tagCause, tagPrincipal:
	case tagType:
		for _, t := range auditd.EventTypes {
			if string(t) == string(b) {
				return string(t)
			}
		}
		return string(b)
	default:
		return string(b) // item keys, paths, hashes: a miss costs more than it saves
	}
	r := &st.recent[tag]
	for i := range r {
		if r[i] == string(b) {
			return r[i]
		}
	}
	s := string(b)
	r[st.next[tag]%uint8(len(r))] = s
	st.next[tag]++
	return s
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

func varintLen(v int64) int {
	u := uint64(v) << 1
	if v < 0 {
		u = ^u
	}
	return uvarintLen(u)
}

// HashEvent returns the chain hash of e after prev: SHA-256 of prev and e's
// canonical encoding, exactly as the ledger computes Event.Hash. buf, which
// may be nil, is reused for the encoding and returned for the next call.
func HashEvent(buf []byte, prev [32]byte, e *auditd.Event) ([32]byte, []byte) {
	buf = append(buf[:0], prev[:]...)
	buf = MarshalCanonical(buf, e)
	return sha256.Sum256(buf), buf
}

// decodeRecord decodes a stored event record into e, with the strings of
// st (nil: allocated).
func decodeRecord(v []byte, e *auditd.Event, st *stringTable) error {
	if len(v) < 2*sha256.Size+1 {
		return fmt.Errorf("%w: record of %d bytes", ErrCorrupt, len(v))
	}
	if err := unmarshalCanonical(v[sha256.Size:len(v)-sha256.Size], e, st); err != nil {
		return err
	}
	copy(e.PrevHash[:], v)
	copy(e.Hash[:], v[len(v)-sha256.Size:])
	return nil
}
