package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// HTTP-date spellings a server may still send (RFC 9110 section 5.6.7).
const (
	rfc850Layout  = "Monday, 02-Jan-06 15:04:05 GMT"
	asctimeLayout = time.ANSIC // "Mon Jan _2 15:04:05 2006"
)

// advertise writes the rate-limit headers of form describing v. Times are
// rounded up to whole seconds, so a client that trusts them is never early.
func advertise(h http.Header, form Advertise, v verdict, local time.Time) {
	switch form {
	case AdvertiseXRate, AdvertiseXRateUnix:
		h.Set("X-RateLimit-Limit", strconv.Itoa(v.requests))
		h.Set("X-RateLimit-Remaining", strconv.Itoa(v.remaining))
		reset := ceilSeconds(v.reset)
		if form == AdvertiseXRateUnix {
			reset = ceilSecond(local.Add(v.reset)).Unix()
		}
		h.Set("X-RateLimit-Reset", strconv.FormatInt(reset, 10))
	case AdvertiseIETF:
		h.Set("RateLimit-Policy", fmt.Sprintf(`"default";q=%d;w=%d`, v.requests, ceilSeconds(v.window)))
		h.Set("RateLimit", fmt.Sprintf(`"default";r=%d;t=%d`, v.remaining, ceilSeconds(v.reset)))
	}
}

// reject is the answer to a request over the limit.
func reject(h http.Header, rj Reject, v verdict, local time.Time) reply {
	wait := v.wait
	if rj.RetryAfterFixed > 0 {
		wait = rj.RetryAfterFixed
	}
	at := ceilSecond(local.Add(wait))
	switch rj.RetryAfter {
	case RetryAfterDelta:
		h.Set("Retry-After", strconv.FormatInt(ceilSeconds(wait), 10))
	case RetryAfterIMFFixdate:
		h.Set("Retry-After", at.Format(http.TimeFormat))
	case RetryAfterRFC850:
		h.Set("Retry-After", at.Format(rfc850Layout))
	case RetryAfterASCTime:
		h.Set("Retry-After", at.Format(asctimeLayout))
	}
	return textReply(h, rj.Status)
}

// unauthorized is the answer to a request without the required credential.
func unauthorized(h http.Header, status int, missing bool) reply {
	if status != 498 {
		return textReply(h, status)
	}
	// ArcGIS answers token problems with 200 and the code in the body.
	if missing {
		return bodyErrorReply(h, BodyArcGIS, 499, "Token Required")
	}
	return bodyErrorReply(h, BodyArcGIS, 498, "Invalid token.")
}

func textReply(h http.Header, status int) reply {
	h.Set("Content-Type", "text/plain; charset=utf-8")
	return reply{status: status, header: h, body: []byte(http.StatusText(status) + "\n")}
}

func jsonReply(h http.Header, status int, v any) reply {
	body, err := json.Marshal(v)
	if err != nil {
		// Only the simulator's own types are marshalled here.
		panic(fmt.Sprintf("sim: marshal response: %v", err))
	}
	h.Set("Content-Type", "application/json; charset=utf-8")
	return reply{status: status, header: h, body: body}
}

type grantsError struct {
	ErrorCode int    `json:"errorcode"`
	Msg       string `json:"msg"`
}

type arcgisError struct {
	Error arcgisErrorBody `json:"error"`
}

type arcgisErrorBody struct {
	Code    int      `json:"code"`
	Message string   `json:"message"`
	Details []string `json:"details"`
}

// bodyErrorReply is a 200 whose body says the request failed.
func bodyErrorReply(h http.Header, style BodyStyle, code int, msg string) reply {
	var v any = grantsError{ErrorCode: code, Msg: msg}
	if style == BodyArcGIS {
		v = arcgisError{arcgisErrorBody{Code: code, Message: msg, Details: []string{}}}
	}
	rep := jsonReply(h, http.StatusOK, v)
	rep.bodyError = true
	return rep
}

// plain is the content of an upstream without a collection: a small JSON
// document naming what was asked for, padded to ResponseBytes. It depends
// only on the seed and the request URI, so a payload's hash is stable.
func (u *upstream) plain(r *http.Request, h http.Header) reply {
	doc := struct {
		Upstream string `json:"upstream"`
		Path     string `json:"path"`
		Data     string `json:"data"`
	}{Upstream: u.cfg.Name, Path: r.URL.RequestURI()}
	rep := jsonReply(h, http.StatusOK, doc)
	if pad := u.cfg.ResponseBytes - len(rep.body); pad > 0 {
		doc.Data = filler(u.seed^hashName(doc.Path), pad)
		rep = jsonReply(h, http.StatusOK, doc)
	}
	return rep
}

// filler returns n letters drawn from seed: payload that JSON leaves as is.
func filler(seed uint64, n int) string {
	var b strings.Builder
	b.Grow(n)
	x := seed
	for i := range n {
		if i%8 == 0 {
			x = mix(x)
		}
		b.WriteByte('a' + byte(x%26))
		x /= 26
	}
	return b.String()
}

// ceilSeconds is d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 {
	return ceilDiv(int64(d), int64(time.Second))
}

// ceilSecond rounds t up to a whole second.
func ceilSecond(t time.Time) time.Time {
	if s := t.Truncate(time.Second); !s.Equal(t) {
		return s.Add(time.Second)
	}
	return t
}
