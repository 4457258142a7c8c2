package reports_test

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/auditd/auditd/reports"
)

func TestWriteCSV(t *testing.T) {
	rep := reconcile(t, mutation{Before: drop(27), Live: cleanLive()}) // R4 fails
	var buf bytes.Buffer
	if err := reports.WriteCSV(&buf, rep); err != nil {
		t.Fatal(err)
	}
	goldenCompare(t, "throttle-without-wait.reconciliation.csv", buf.Bytes())

	rows, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if want := 1 + 10*(1+len(rep.Sources)); len(rows) != want {
		t.Fatalf("%d rows, want %d", len(rows), want)
	}
	for _, r := range rows[1:] {
		if r[1] == "total" && r[2] == "R4" && (r[3] != "fail" || r[7] != "13") {
			t.Errorf("total R4 row %q: want fail naming seq 13", r)
		}
	}
}

func TestWriteXLSX(t *testing.T) {
	rep := reconcile(t, mutation{Before: drop(27), Live: cleanLive()}) // R4 fails
	var a, b bytes.Buffer
	if err := reports.WriteXLSX(&a, rep, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := reports.WriteXLSX(&b, rep, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("the same report gives different workbooks")
	}
	wb := readWorkbook(t, a.Bytes())
	goldenCompare(t, "throttle-without-wait.reconciliation.txt", []byte(wb.dump()))

	if want := []string{"Summary", "Detail per source", "Checks", "Served from cache", "Sign-off"}; !slices.Equal(wb.names, want) {
		t.Fatalf("sheets %q, want %q", wb.names, want)
	}
	// Checks rows are the CSV rows; Detail ties to the JSON per source.
	var csvBuf bytes.Buffer
	if err := reports.WriteCSV(&csvBuf, rep); err != nil {
		t.Fatal(err)
	}
	rows, _ := csv.NewReader(&csvBuf).ReadAll()
	if got := wb.sheets["Checks"]; len(got) != len(rows) {
		t.Fatalf("Checks has %d rows, CSV %d", len(got), len(rows))
	}
	for i, r := range wb.sheets["Checks"][1:] {
		if !slices.Equal(r, rows[i+1]) {
			t.Errorf("Checks row %d %q, CSV %q", i+1, r, rows[i+1])
		}
	}
	for i, s := range rep.Sources {
		r := wb.sheets["Detail per source"][i+1]
		if r[0] != s.SourceID || r[1] != strings.ToUpper(strconv.FormatBool(s.Balanced)) || r[4] != strconv.FormatInt(s.Counts.Queued, 10) || r[9] != strconv.FormatInt(s.Counts.Pending, 10) {
			t.Errorf("Detail row %q, JSON %s balanced=%t", r, s.SourceID, s.Balanced)
		}
	}
}

// TestReport_MatchesAPIContract validates the JSON against the
// Reconciliation schema of api/openapi.yaml, the contract CI relies on.
func TestReport_MatchesAPIContract(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromFile(filepath.Join(testdataDir(), "..", "..", "api", "openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	schema := doc.Components.Schemas["Reconciliation"]
	if schema == nil {
		t.Fatal("openapi.yaml has no Reconciliation schema")
	}
	for _, m := range []mutation{{Live: cleanLive()}, {Before: drop(27)}} {
		rep := reconcile(t, m)
		var buf bytes.Buffer
		if err := reports.WriteJSON(&buf, rep); err != nil {
			t.Fatal(err)
		}
		var v any
		if err := json.Unmarshal(buf.Bytes(), &v); err != nil {
			t.Fatal(err)
		}
		if err := schema.Value.VisitJSON(v); err != nil {
			t.Errorf("reconciliation JSON breaks the API contract: %v", err)
		}
		var pass = true
		for _, c := range rep.Checks {
			pass = pass && c.Pass
		}
		if pass != rep.Balanced {
			t.Errorf("balanced %t is not the AND of every check's pass", rep.Balanced)
		}
	}
}

func TestWrite_Formats(t *testing.T) {
	rep := reconcile(t, mutation{Live: cleanLive()})
	for _, tt := range []struct {
		format string
		magic  string // how the output starts
	}{{"json", "{"}, {"csv", "run,scope,id"}, {"xlsx", "PK\x03\x04"}} {
		t.Run(tt.format, func(t *testing.T) {
			var buf bytes.Buffer
			if err := reports.Write(&buf, rep, tt.format); err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(buf.String(), tt.magic) {
				t.Errorf("%s output starts %q", tt.format, buf.String()[:min(buf.Len(), 16)])
			}
		})
	}
	if err := reports.Write(io.Discard, rep, "pdf"); !errors.Is(err, reports.ErrUnknownFormat) {
		t.Errorf("pdf: err = %v, want ErrUnknownFormat", err)
	}
}
