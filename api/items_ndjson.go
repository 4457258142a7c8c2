package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/auditd/auditd"
	"github.com/labstack/echo/v4"
)

// mimeNDJSON is the media type of a page of items streamed in: one item's
// JSON a line.
const mimeNDJSON = "application/x-ndjson"

// ndjsonChunk is how many items of a streamed page are decoded, validated,
// charged and stored together: what the service holds of the page at once.
const ndjsonChunk = 1000

// isNDJSON reports whether the request's body is NDJSON.
func isNDJSON(c echo.Context) bool {
	mt, _, err := mime.ParseMediaType(c.Request().Header.Get(echo.HeaderContentType))
	return err == nil && mt == mimeNDJSON
}

// handleAddItemsNDJSON adds a page of any size to an open batch run, its
// items streamed in as NDJSON and stored a chunk at a time, pending until
// the body ends; then the page is the run's, whole (Runs.AddRunItemsStream).
// A line that is not an item, an item the run or the page has already, or
// a body that breaks off refuses the page, naming the line; nothing of it
// is kept. Each line is at most MaxBodyBytes; blank lines are skipped. The
// token is charged an item a unit as the chunks come.
func (s *Server) handleAddItemsNDJSON(c echo.Context) error {
	ctx := c.Request().Context()
	id := c.Param("id")
	if _, err := s.Runs.Run(ctx, id); err != nil {
		return err
	}
	tok := token(c)
	if err := s.charge(c, tok, costRequest); err != nil {
		return err
	}
	lines := &ndjsonLines{s: s, sc: bufio.NewScanner(c.Request().Body)}
	lines.sc.Buffer(make([]byte, 0, 64<<10), int(s.MaxBodyBytes))
	next := func() ([]auditd.Item, error) {
		items, err := lines.chunk()
		if err == nil {
			err = s.charge(c, tok, float64(len(items)))
		}
		return items, err
	}
	st, err := s.Runs.AddRunItemsStream(ctx, id, next)
	if err != nil {
		return lines.name(err)
	}
	return c.JSON(http.StatusOK, st)
}

// ndjsonLines reads a streamed page's items a chunk at a time, and names
// the line of an item an error is about.
type ndjsonLines struct {
	s     *Server
	sc    *bufio.Scanner
	line  int   // lines read
	items int   // items read
	lines []int // the line of each item of the last chunk
}

// chunk returns the next items, up to ndjsonChunk, each decoded and
// validated alone; io.EOF after the last.
func (l *ndjsonLines) chunk() ([]auditd.Item, error) {
	items := make([]auditd.Item, 0, ndjsonChunk)
	lines := make([]int, 0, ndjsonChunk)
	for len(items) < ndjsonChunk && l.sc.Scan() {
		l.line++
		raw := bytes.TrimSpace(l.sc.Bytes())
		if len(raw) == 0 {
			continue
		}
		var it auditd.Item
		if err := decodeItem(raw, &it); err != nil {
			return nil, l.atLine(l.line, err)
		}
		if err := l.s.validate.Struct(&it); err != nil {
			return nil, l.atLine(l.line, validationError(err))
		}
		items = append(items, it)
		lines = append(lines, l.line)
	}
	if err := l.sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &auditd.Error{Code: codeTooLarge, Field: fmt.Sprintf("line %d", l.line+1),
				Message: fmt.Sprintf("Line %d is longer than %d bytes, the most an item's line may be.", l.line+1, l.s.MaxBodyBytes)}
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, invalid(fmt.Sprintf("line %d", l.line+1), "Line %d: the body broke off there.", l.line+1)
		}
		return nil, fmt.Errorf("read the items after line %d: %w", l.line, err)
	}
	if len(items) == 0 {
		if l.items == 0 {
			return nil, invalid("", "The body holds no item; one item's JSON a line is required.")
		}
		return nil, io.EOF
	}
	l.items += len(items)
	l.lines = lines
	return items, nil
}

// decodeItem decodes one line into it: one object, no unknown fields,
// nothing after it.
func decodeItem(raw []byte, it *auditd.Item) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(it); err != nil {
		return decodeError(err)
	}
	if dec.More() {
		return invalid("", "More than one JSON value on the line.")
	}
	return nil
}

// atLine says that err, about the item on line n, is about that line: its
// field becomes the line's ("line 17: key") and its message starts with it.
func (l *ndjsonLines) atLine(n int, err error) error {
	var e *auditd.Error
	if !errors.As(err, &e) {
		return err
	}
	field := fmt.Sprintf("line %d", n)
	if e.Field != "" {
		field += ": " + e.Field
	}
	return &auditd.Error{Code: e.Code, Field: field, Message: fmt.Sprintf("Line %d: %s", n, e.Message)}
}

// name turns an error the run store gave about the last chunk's item i
// (field "items[i]..." ) into one naming its line.
func (l *ndjsonLines) name(err error) error {
	var e *auditd.Error
	if !errors.As(err, &e) || !strings.HasPrefix(e.Field, "items[") {
		return err
	}
	end := strings.IndexByte(e.Field, ']')
	i, perr := strconv.Atoi(e.Field[len("items["):max(end, len("items["))])
	if end < 0 || perr != nil || i < 0 || i >= len(l.lines) {
		return err
	}
	rest := strings.TrimPrefix(e.Field[end+1:], ".")
	return l.atLine(l.lines[i], &auditd.Error{Code: e.Code, Field: rest, Message: e.Message})
}
