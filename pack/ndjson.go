package pack

import (
	"encoding/hex"
	"encoding/json"
	"strconv"
	"time"

	"github.com/auditd/auditd"
	"golang.org/x/mod/sumdb/tlog"
)

// appendLeafLine appends e's line of events.ndjson (with its newline) to
// b: exactly what encoding/json makes of leafJSON (TestLeafLineIsJSON
// holds it to that), written field by field, since a pack renders a
// million of them and its verifier renders them again.
func appendLeafLine(b []byte, e *auditd.Event, leaf tlog.Hash) ([]byte, error) {
	attempt, cause := e.Shared() // as the ledger's encoding and the API's JSON hold them
	b = append(b, `{"seq":`...)
	b = strconv.AppendUint(b, e.Seq, 10)
	b = appendStr(b, `,"type":`, string(e.Type))
	b = optStr(b, `,"run_id":`, e.RunID)
	b = optStr(b, `,"source_id":`, e.SourceID)
	b = optStr(b, `,"item_key":`, e.ItemKey)
	b = optUint(b, `,"page":`, uint64(e.Page))
	b = optUint(b, `,"attempt":`, uint64(attempt))
	t := e.Time.UTC()
	if y := t.Year(); y < 0 || y > 9999 {
		j, err := json.Marshal(t)
		if err != nil {
			return b, err
		}
		b = append(append(b, `,"time":`...), j...)
	} else {
		b = append(b, `,"time":"`...)
		b = t.AppendFormat(b, time.RFC3339Nano)
		b = append(b, '"')
	}
	b = optDur(b, `,"mono":`, e.Mono)
	b = optStr(b, `,"idempotency_key":`, e.IdempotencyKey)
	b = optStr(b, `,"method":`, e.Method)
	b = optStr(b, `,"path":`, e.Path)
	b = optInt(b, `,"status":`, int64(e.Status))
	b = optInt(b, `,"bytes":`, e.Bytes)
	b = optDur(b, `,"latency":`, e.Latency)
	b = optDur(b, `,"wait":`, e.Wait)
	b = optDur(b, `,"actual":`, e.Actual)
	b = optStr(b, `,"retry_after_raw":`, e.RetryAfterRaw)
	b = optDur(b, `,"retry_after":`, e.RetryAfter)
	if e.Clamped {
		b = append(b, `,"clamped":true`...)
	}
	b = optDur(b, `,"backoff":`, e.Backoff)
	b = optStr(b, `,"from":`, e.From)
	b = optStr(b, `,"to":`, e.To)
	b = optInt(b, `,"failures":`, int64(e.Failures))
	b = optInt(b, `,"threshold":`, int64(e.Threshold))
	b = optDur(b, `,"cooldown":`, e.Cooldown)
	b = optInt(b, `,"old_limit":`, int64(e.OldLimit))
	b = optInt(b, `,"new_limit":`, int64(e.NewLimit))
	b = optDur(b, `,"old_window":`, e.OldWindow)
	b = optDur(b, `,"new_window":`, e.NewWindow)
	b = optStr(b, `,"group":`, e.Group)
	b = optStr(b, `,"outcome":`, string(e.Outcome))
	b = optStr(b, `,"body_error":`, e.BodyError)
	b = optStr(b, `,"payload_hash":`, e.PayloadHash)
	b = optStr(b, `,"cause":`, cause)
	b = optStr(b, `,"principal":`, e.Principal)
	b = optStr(b, `,"detail":`, e.Detail)
	b = append(b, `,"prev_hash":"`...)
	b = hex.AppendEncode(b, e.PrevHash[:])
	b = append(b, `","hash":"`...)
	b = hex.AppendEncode(b, e.Hash[:])
	b = append(b, `","leaf_index":`...)
	b = strconv.AppendUint(b, e.Seq-1, 10)
	b = append(b, `,"leaf_hash":"`...)
	b = hex.AppendEncode(b, leaf[:])
	return append(b, "\"}\n"...), nil
}

func optStr(b []byte, key, s string) []byte {
	if s == "" {
		return b
	}
	return appendStr(b, key, s)
}

// appendStr appends key and s as a JSON string, as encoding/json writes
// it: plain printable ASCII as it is, anything else through json.Marshal
// (HTML-safe escaping, invalid UTF-8 replaced).
func appendStr(b []byte, key, s string) []byte {
	b = append(b, key...)
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			j, _ := json.Marshal(s)
			return append(b, j...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

func optUint(b []byte, key string, v uint64) []byte {
	if v == 0 {
		return b
	}
	return strconv.AppendUint(append(b, key...), v, 10)
}

func optInt(b []byte, key string, v int64) []byte {
	if v == 0 {
		return b
	}
	return strconv.AppendInt(append(b, key...), v, 10)
}

func optDur(b []byte, key string, d time.Duration) []byte {
	if d == 0 {
		return b
	}
	return append(append(append(b, key...), '"'), d.String()+`"`...)
}
