package sim_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestArcGISPaging walks a 2500-record layer by resultOffset until
// exceededTransferLimit goes away, as a client would.
func TestArcGISPaging(t *testing.T) {
	f := mustServe(t, mustLoad(t, "paging.yaml"))
	type page struct {
		Features []struct {
			Attributes struct {
				ObjectID int `json:"OBJECTID"`
			} `json:"attributes"`
		} `json:"features"`
		ExceededTransferLimit bool `json:"exceededTransferLimit"`
	}
	var ids, sizes []int
	for offset := 0; ; {
		r := f.get("arcgis-parcels", fmt.Sprintf("where=1%%3D1&outFields=*&f=json&resultOffset=%d&resultRecordCount=5000", offset))
		var p page
		if err := json.Unmarshal([]byte(r.body), &p); err != nil {
			t.Fatalf("page at %d: %v", offset, err)
		}
		sizes = append(sizes, len(p.Features))
		for _, ft := range p.Features {
			ids = append(ids, ft.Attributes.ObjectID)
		}
		offset += len(p.Features)
		if !p.ExceededTransferLimit {
			break
		}
		if len(sizes) > 10 {
			t.Fatal("paging does not end")
		}
	}
	// resultRecordCount=5000 is capped at max_page.
	if !slices.Equal(sizes, []int{1000, 1000, 500}) {
		t.Errorf("page sizes %v, want [1000 1000 500]", sizes)
	}
	for i, id := range ids {
		if id != i+1 {
			t.Fatalf("OBJECTID %d at position %d: pages overlap or skip", id, i)
		}
	}
	var count struct{ Count int }
	if err := json.Unmarshal([]byte(f.get("arcgis-parcels", "returnCountOnly=true").body), &count); err != nil || count.Count != 2500 {
		t.Errorf("returnCountOnly: %+v %v, want 2500", count, err)
	}
	r := f.get("arcgis-parcels", "resultOffset=-4")
	if r.status != 200 || !strings.Contains(r.body, `"error":{"code":400`) {
		t.Errorf("bad resultOffset: %d %q, want 200 with an error code 400 body", r.status, r.body)
	}
}

func TestWFSPaging(t *testing.T) {
	f := mustServe(t, mustLoad(t, "paging.yaml"))
	type collection struct {
		Type           string `json:"type"`
		NumberMatched  int    `json:"numberMatched"`
		NumberReturned int    `json:"numberReturned"`
		Features       []struct {
			ID string `json:"id"`
		} `json:"features"`
	}
	seen := make(map[string]bool)
	var returned []int
	for start := 0; start < 1000; start += 200 {
		// KVP names are case-insensitive in WFS.
		r := f.get("wfs-zoning", fmt.Sprintf("service=WFS&version=2.0.0&request=GetFeature&typeNames=zoning&outputFormat=application/json&STARTINDEX=%d&count=200", start))
		var c collection
		if err := json.Unmarshal([]byte(r.body), &c); err != nil {
			t.Fatalf("startIndex %d: %v", start, err)
		}
		if c.Type != "FeatureCollection" || c.NumberMatched != 730 || c.NumberReturned != len(c.Features) {
			t.Fatalf("startIndex %d: type %q matched %d returned %d of %d features", start, c.Type, c.NumberMatched, c.NumberReturned, len(c.Features))
		}
		returned = append(returned, c.NumberReturned)
		for _, ft := range c.Features {
			seen[ft.ID] = true
		}
	}
	if !slices.Equal(returned, []int{200, 200, 200, 130, 0}) || len(seen) != 730 {
		t.Errorf("returned %v with %d distinct ids, want [200 200 200 130 0] and 730", returned, len(seen))
	}
	if r := f.get("wfs-zoning", "startIndex=x"); r.status != http.StatusBadRequest {
		t.Errorf("bad startIndex: %d, want 400", r.status)
	}
}

func TestGrantsGovPaging(t *testing.T) {
	f := mustServe(t, mustLoad(t, "paging.yaml"))
	type result struct {
		ErrorCode int `json:"errorcode"`
		Data      struct {
			HitCount    int `json:"hitCount"`
			StartRecord int `json:"startRecord"`
			OppHits     []struct {
				ID string `json:"id"`
			} `json:"oppHits"`
		} `json:"data"`
	}
	var sizes []int
	ids := make(map[string]bool)
	for start := 0; start < 300; start += 100 {
		r := f.do(http.MethodPost, "grants-search", "", fmt.Sprintf(`{"keyword":"","oppStatuses":"posted","startRecordNum":%d,"rows":100}`, start))
		var res result
		if err := json.Unmarshal([]byte(r.body), &res); err != nil {
			t.Fatalf("startRecordNum %d: %v", start, err)
		}
		if res.ErrorCode != 0 || res.Data.HitCount != 260 || res.Data.StartRecord != start {
			t.Fatalf("startRecordNum %d: %+v", start, res)
		}
		sizes = append(sizes, len(res.Data.OppHits))
		for _, h := range res.Data.OppHits {
			ids[h.ID] = true
		}
	}
	if !slices.Equal(sizes, []int{100, 100, 60}) || len(ids) != 260 {
		t.Errorf("pages %v with %d distinct ids, want [100 100 60] and 260", sizes, len(ids))
	}
	if r := f.get("grants-search", ""); r.status != http.StatusMethodNotAllowed || r.header.Get("Allow") != "POST" {
		t.Errorf("GET: %d Allow %q, want 405 Allow POST", r.status, r.header.Get("Allow"))
	}
	if r := f.do(http.MethodPost, "grants-search", "", `{"rows":`); r.status != http.StatusBadRequest {
		t.Errorf("truncated body: %d, want 400", r.status)
	}
}

// TestContentIsDeterministic: the same scenario gives the same bytes
// whenever it runs; another seed gives other content.
func TestContentIsDeterministic(t *testing.T) {
	requests := []struct{ upstream, method, query, body string }{
		{"arcgis-parcels", http.MethodGet, "resultOffset=1000&resultRecordCount=50", ""},
		{"wfs-zoning", http.MethodGet, "startIndex=100&count=50", ""},
		{"grants-search", http.MethodPost, "", `{"startRecordNum":20,"rows":20}`},
	}
	a := mustServe(t, mustLoad(t, "paging.yaml"))
	b := mustServe(t, mustLoad(t, "paging.yaml"))
	b.clk.Advance(48 * time.Hour) // other days: content must not depend on the clock
	reseeded := mustLoad(t, "paging.yaml")
	reseeded.Seed++
	c := mustServe(t, reseeded)
	for _, r := range requests {
		t.Run(r.upstream, func(t *testing.T) {
			ra := a.do(r.method, r.upstream, r.query, r.body)
			rb := b.do(r.method, r.upstream, r.query, r.body)
			rc := c.do(r.method, r.upstream, r.query, r.body)
			if ra.status != 200 || ra.body != rb.body {
				t.Errorf("same seed, different bodies (status %d)", ra.status)
			}
			if ra.body == rc.body {
				t.Error("another seed gave the same body")
			}
		})
	}
}
