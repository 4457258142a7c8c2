package hints

import "time"

// The parsers below are hand-written rather than time.Parse because
// time.Parse allocates a zone for "GMT" on every call and accepts shapes RFC
// 9110 does not; these accept exactly the three HTTP-date forms (plus "UTC"
// for "GMT", which misconfigured servers send and which means the same).

var shortDays = [7]string{"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"}

var longDays = [7]string{"Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"}

var months = [12]string{"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"}

// parseHTTPDate parses an HTTP-date. ref resolves the two-digit year of the
// obsolete RFC 850 form: per RFC 9110 section 5.6.7, a year that appears more
// than 50 years after ref is taken as the most recent past year with the
// same last two digits.
func parseHTTPDate(s string, ref time.Time) (time.Time, bool) {
	switch {
	case len(s) == 29 && s[3] == ',':
		return parseIMFFixdate(s)
	case len(s) == 24 && s[3] == ' ':
		return parseASCTime(s)
	}
	return parseRFC850(s, ref)
}

// parseIMFFixdate parses "Sun, 06 Nov 1994 08:49:37 GMT".
func parseIMFFixdate(s string) (time.Time, bool) {
	if !oneOf(s[0:3], shortDays[:]) || s[4] != ' ' || s[7] != ' ' || s[11] != ' ' || s[16] != ' ' || s[25] != ' ' || !isGMT(s[26:29]) {
		return time.Time{}, false
	}
	day, ok1 := atoi2(s[5:7])
	mon, ok2 := month(s[8:11])
	year, ok3 := atoi4(s[12:16])
	if !ok1 || !ok2 || !ok3 {
		return time.Time{}, false
	}
	return clockTime(year, mon, day, s[17:25])
}

// parseASCTime parses "Sun Nov  6 08:49:37 1994".
func parseASCTime(s string) (time.Time, bool) {
	if !oneOf(s[0:3], shortDays[:]) || s[7] != ' ' || s[10] != ' ' || s[19] != ' ' {
		return time.Time{}, false
	}
	mon, ok1 := month(s[4:7])
	// asctime pads a one-digit day with a space: "Nov  6".
	day, ok2 := atoi2(s[8:10])
	if s[8] == ' ' && isDigit(s[9]) {
		day, ok2 = int(s[9]-'0'), true
	}
	year, ok3 := atoi4(s[20:24])
	if !ok1 || !ok2 || !ok3 {
		return time.Time{}, false
	}
	return clockTime(year, mon, day, s[11:19])
}

// parseRFC850 parses "Sunday, 06-Nov-94 08:49:37 GMT".
func parseRFC850(s string, ref time.Time) (time.Time, bool) {
	comma := -1
	for i := 0; i < len(s) && i < 10; i++ {
		if s[i] == ',' {
			comma = i
			break
		}
	}
	if comma < 0 || !oneOf(s[:comma], longDays[:]) {
		return time.Time{}, false
	}
	r := s[comma:]
	// ", 06-Nov-94 08:49:37 GMT" is 24 bytes.
	if len(r) != 24 || r[1] != ' ' || r[4] != '-' || r[8] != '-' || r[11] != ' ' || r[20] != ' ' || !isGMT(r[21:24]) {
		return time.Time{}, false
	}
	day, ok1 := atoi2(r[2:4])
	mon, ok2 := month(r[5:8])
	yy, ok3 := atoi2(r[9:11])
	if !ok1 || !ok2 || !ok3 {
		return time.Time{}, false
	}
	refYear := ref.UTC().Year()
	year := refYear - refYear%100 + yy
	if year > refYear+50 {
		year -= 100
	}
	return clockTime(year, mon, day, r[12:20])
}

// clockTime validates "hh:mm:ss" and the day of the month and builds the UTC
// instant. time.Date would quietly turn 31 Feb into 3 Mar; that is garbage
// here, not a date.
func clockTime(year int, mon time.Month, day int, hms string) (time.Time, bool) {
	if hms[2] != ':' || hms[5] != ':' {
		return time.Time{}, false
	}
	hh, ok1 := atoi2(hms[0:2])
	mm, ok2 := atoi2(hms[3:5])
	ss, ok3 := atoi2(hms[6:8])
	if !ok1 || !ok2 || !ok3 || hh > 23 || mm > 59 || ss > 60 || day < 1 {
		return time.Time{}, false
	}
	t := time.Date(year, mon, day, hh, mm, 0, 0, time.UTC)
	if t.Day() != day {
		return time.Time{}, false
	}
	// A leap second (ss == 60) lands on the next minute, as time.Date would.
	return t.Add(time.Duration(ss) * time.Second), true
}

func month(s string) (time.Month, bool) {
	for i, m := range months {
		if s == m {
			return time.Month(i + 1), true
		}
	}
	return 0, false
}

func oneOf(s string, set []string) bool {
	for _, x := range set {
		if s == x {
			return true
		}
	}
	return false
}

func isGMT(s string) bool { return s == "GMT" || s == "UTC" }

func atoi2(s string) (int, bool) {
	if !isDigit(s[0]) || !isDigit(s[1]) {
		return 0, false
	}
	return int(s[0]-'0')*10 + int(s[1]-'0'), true
}

func atoi4(s string) (int, bool) {
	hi, ok1 := atoi2(s[0:2])
	lo, ok2 := atoi2(s[2:4])
	return hi*100 + lo, ok1 && ok2
}
