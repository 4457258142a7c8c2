package fetch

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/auditd/auditd"
)

// DefaultPageSize is the page size of a paged item that names none.
const DefaultPageSize = 1000

// maxPages stops a paged item whose upstream never says it is complete.
const maxPages = 100_000

// page is one request of an item: an unpaged item has exactly one.
type page struct {
	index int
	path  string
	body  []byte
}

// pageInfo is what a paged response says about the collection.
type pageInfo struct {
	records int  // records on this page
	total   int  // the upstream's advertised total; -1 when it gives none
	more    bool // another page follows
}

// pageRequest builds page p of it.
func pageRequest(it *auditd.Item, p int) (page, error) {
	size := it.PageSize
	if size == 0 {
		size = DefaultPageSize
	}
	switch it.Paging {
	case auditd.PagingNone:
		return page{index: 0, path: it.Path, body: it.Body}, nil
	case auditd.PagingArcGIS:
		return page{index: p, path: withQuery(it.Path, map[string]int{"resultOffset": p * size, "resultRecordCount": size})}, nil
	case auditd.PagingWFS:
		return page{index: p, path: withQuery(it.Path, map[string]int{"startIndex": p * size, "count": size})}, nil
	case auditd.PagingGrantsGov:
		fields := map[string]any{}
		if len(it.Body) > 0 {
			if err := json.Unmarshal(it.Body, &fields); err != nil {
				return page{}, auditd.Errorf(auditd.EINVALID, "item %s: body is not a JSON object: %v", it.Key, err)
			}
		}
		fields["startRecordNum"] = p * size
		fields["rows"] = size
		body, err := json.Marshal(fields)
		if err != nil {
			return page{}, fmt.Errorf("encode page body: %w", err)
		}
		return page{index: p, path: it.Path, body: body}, nil
	}
	return page{}, auditd.Errorf(auditd.EINVALID, "item %s: unknown paging mode %q", it.Key, it.Paging)
}

// parsePage reads what a page of mode says about the collection. offset is
// the number of records requested before this page.
func parsePage(mode auditd.Paging, body []byte, offset int) (pageInfo, error) {
	switch mode {
	case auditd.PagingArcGIS:
		var v struct {
			Features []json.RawMessage `json:"features"`
			Exceeded bool              `json:"exceededTransferLimit"`
		}
		if err := json.Unmarshal(body, &v); err != nil {
			return pageInfo{}, fmt.Errorf("arcgis page: %w", err)
		}
		return pageInfo{records: len(v.Features), total: -1, more: v.Exceeded && len(v.Features) > 0}, nil
	case auditd.PagingWFS:
		var v struct {
			Matched  json.RawMessage   `json:"numberMatched"`
			Features []json.RawMessage `json:"features"`
		}
		if err := json.Unmarshal(body, &v); err != nil {
			return pageInfo{}, fmt.Errorf("wfs page: %w", err)
		}
		total := -1
		if n, err := strconv.Atoi(string(v.Matched)); err == nil {
			total = n
		}
		n := len(v.Features)
		more := n > 0 && (total < 0 || offset+n < total)
		return pageInfo{records: n, total: total, more: more}, nil
	case auditd.PagingGrantsGov:
		var v struct {
			Data struct {
				HitCount int               `json:"hitCount"`
				OppHits  []json.RawMessage `json:"oppHits"`
			} `json:"data"`
		}
		if err := json.Unmarshal(body, &v); err != nil {
			return pageInfo{}, fmt.Errorf("grants.gov page: %w", err)
		}
		n := len(v.Data.OppHits)
		return pageInfo{records: n, total: v.Data.HitCount, more: n > 0 && offset+n < v.Data.HitCount}, nil
	}
	return pageInfo{total: -1}, nil
}
