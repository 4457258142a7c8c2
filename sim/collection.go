package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// maxRequestBody caps a Grants.gov search body; real ones are a few hundred bytes.
const maxRequestBody = 1 << 20

// record is one generated row of a collection. Every field comes from the
// upstream's seed and the row's index, never from the clock, so a page's
// bytes are the same on every run.
type record struct {
	index  int
	bits   uint64
	lon    float64
	lat    float64
	acres  float64
	zoning string
}

var zonings = [...]string{"R-1", "R-2", "R-3", "C-1", "C-2", "I-1", "AG", "MU", "OS"}

func (u *upstream) record(i int) record {
	x := mix(u.seed ^ mix(uint64(i)))
	return record{
		index:  i,
		bits:   x,
		lon:    -124 + float64(x%57_000_000)/1_000_000, // the conterminous US, roughly
		lat:    25 + float64(x>>26%24_000_000)/1_000_000,
		acres:  float64(x>>32%100_000) / 100,
		zoning: zonings[x>>8%uint64(len(zonings))],
	}
}

// window clamps a requested page to the collection: the records [from, to).
func (u *upstream) window(offset, count int) (from, to int) {
	col := u.cfg.Collection
	from = min(offset, col.Records)
	to = min(from+min(count, col.MaxPage), col.Records)
	return from, to
}

// page serves one page of the upstream's collection.
func (u *upstream) page(r *http.Request, h http.Header) reply {
	switch u.cfg.Collection.Kind {
	case CollectionArcGIS:
		return u.arcgisPage(r, h)
	case CollectionWFS:
		return u.wfsPage(r, h)
	default:
		return u.grantsPage(r, h)
	}
}

// intParam reads a non-negative integer parameter, def when absent.
func intParam(raw string, def int) (int, bool) {
	if raw == "" {
		return def, true
	}
	n, err := strconv.Atoi(raw)
	return n, err == nil && n >= 0
}

type arcgisFeature struct {
	Attributes arcgisAttributes `json:"attributes"`
	Geometry   arcgisPoint      `json:"geometry"`
}

type arcgisAttributes struct {
	ObjectID int     `json:"OBJECTID"`
	ParcelID string  `json:"PARCEL_ID"`
	Zoning   string  `json:"ZONING"`
	Acres    float64 `json:"ACRES"`
}

type arcgisPoint struct {
	X float64 `json:"x"`
	Y float64 `json:"y"`
}

type arcgisQuery struct {
	ObjectIDFieldName     string          `json:"objectIdFieldName"`
	GeometryType          string          `json:"geometryType"`
	SpatialReference      map[string]int  `json:"spatialReference"`
	Features              []arcgisFeature `json:"features"`
	ExceededTransferLimit bool            `json:"exceededTransferLimit,omitempty"`
}

// arcgisPage answers a FeatureServer layer query: resultOffset and
// resultRecordCount page it, returnCountOnly=true counts it. Like ArcGIS,
// bad parameters get a 200 with an error body, and exceededTransferLimit is
// present only when more records follow.
func (u *upstream) arcgisPage(r *http.Request, h http.Header) reply {
	col := u.cfg.Collection
	if strings.EqualFold(r.FormValue("returnCountOnly"), "true") {
		return jsonReply(h, http.StatusOK, map[string]int{"count": col.Records})
	}
	offset, ok1 := intParam(r.FormValue("resultOffset"), 0)
	count, ok2 := intParam(r.FormValue("resultRecordCount"), col.MaxPage)
	if !ok1 || !ok2 {
		return bodyErrorReply(h, BodyArcGIS, 400, "Invalid or missing input parameters.")
	}
	from, to := u.window(offset, count)
	q := arcgisQuery{
		ObjectIDFieldName:     "OBJECTID",
		GeometryType:          "esriGeometryPoint",
		SpatialReference:      map[string]int{"wkid": 4326},
		Features:              make([]arcgisFeature, 0, to-from),
		ExceededTransferLimit: to < col.Records && to > from,
	}
	for i := from; i < to; i++ {
		rec := u.record(i)
		q.Features = append(q.Features, arcgisFeature{
			Attributes: arcgisAttributes{
				ObjectID: i + 1,
				ParcelID: fmt.Sprintf("%s-%08d", strings.ToUpper(col.Layer), i+1),
				Zoning:   rec.zoning,
				Acres:    rec.acres,
			},
			Geometry: arcgisPoint{X: rec.lon, Y: rec.lat},
		})
	}
	return jsonReply(h, http.StatusOK, q)
}

type geoFeature struct {
	Type       string         `json:"type"`
	ID         string         `json:"id"`
	Geometry   geoPoint       `json:"geometry"`
	Properties map[string]any `json:"properties"`
}

type geoPoint struct {
	Type        string     `json:"type"`
	Coordinates [2]float64 `json:"coordinates"`
}

type geoCollection struct {
	Type           string       `json:"type"`
	Features       []geoFeature `json:"features"`
	TotalFeatures  int          `json:"totalFeatures"`
	NumberMatched  int          `json:"numberMatched"`
	NumberReturned int          `json:"numberReturned"`
}

// wfsPage answers a WFS 2.0 GetFeature in GeoJSON, as GeoServer does:
// startIndex and count page it. KVP parameter names are case-insensitive.
func (u *upstream) wfsPage(r *http.Request, h http.Header) reply {
	col := u.cfg.Collection
	param := func(name string) string {
		for k, v := range r.URL.Query() {
			if strings.EqualFold(k, name) && len(v) > 0 {
				return v[0]
			}
		}
		return ""
	}
	offset, ok1 := intParam(param("startIndex"), 0)
	count, ok2 := intParam(param("count"), col.MaxPage)
	if !ok1 || !ok2 {
		h.Set("Content-Type", "application/xml")
		return reply{status: http.StatusBadRequest, header: h, body: []byte(
			`<?xml version="1.0" encoding="UTF-8"?><ows:ExceptionReport xmlns:ows="http://www.opengis.net/ows/1.1" version="2.0.0">` +
				`<ows:Exception exceptionCode="InvalidParameterValue" locator="startIndex"><ows:ExceptionText>startIndex and count must be non-negative integers</ows:ExceptionText></ows:Exception></ows:ExceptionReport>`)}
	}
	from, to := u.window(offset, count)
	fc := geoCollection{
		Type:           "FeatureCollection",
		Features:       make([]geoFeature, 0, to-from),
		TotalFeatures:  col.Records,
		NumberMatched:  col.Records,
		NumberReturned: to - from,
	}
	for i := from; i < to; i++ {
		rec := u.record(i)
		fc.Features = append(fc.Features, geoFeature{
			Type:     "Feature",
			ID:       fmt.Sprintf("%s.%d", col.Layer, i+1),
			Geometry: geoPoint{Type: "Point", Coordinates: [2]float64{rec.lon, rec.lat}},
			Properties: map[string]any{
				"parcel_id": fmt.Sprintf("%s-%08d", strings.ToUpper(col.Layer), i+1),
				"zoning":    rec.zoning,
				"acres":     rec.acres,
			},
		})
	}
	return jsonReply(h, http.StatusOK, fc)
}

type grantsSearch struct {
	StartRecordNum *int `json:"startRecordNum"`
	Rows           *int `json:"rows"`
}

type grantsResult struct {
	ErrorCode int        `json:"errorcode"`
	Msg       string     `json:"msg"`
	Data      grantsData `json:"data"`
}

type grantsData struct {
	HitCount    int         `json:"hitCount"`
	StartRecord int         `json:"startRecord"`
	OppHits     []grantsOpp `json:"oppHits"`
}

type grantsOpp struct {
	ID         string   `json:"id"`
	Number     string   `json:"number"`
	Title      string   `json:"title"`
	AgencyCode string   `json:"agencyCode"`
	OpenDate   string   `json:"openDate"`
	CloseDate  string   `json:"closeDate"`
	OppStatus  string   `json:"oppStatus"`
	DocType    string   `json:"docType"`
	CFDAList   []string `json:"cfdaList"`
}

var agencies = [...]string{"HHS-NIH11", "USDA-NIFA", "DOT-FHWA", "HUD", "EPA", "DOC-NOAA", "ED", "DOJ-OJP"}

// grantsPage answers Grants.gov search2: a POSTed JSON body whose
// startRecordNum and rows page it. Other body fields are accepted and ignored.
func (u *upstream) grantsPage(r *http.Request, h http.Header) reply {
	if r.Method != http.MethodPost {
		h.Set("Allow", http.MethodPost)
		return textReply(h, http.StatusMethodNotAllowed)
	}
	col := u.cfg.Collection
	var req grantsSearch
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxRequestBody))
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	offset, count := 0, col.MaxPage
	if req.StartRecordNum != nil {
		offset = *req.StartRecordNum
	}
	if req.Rows != nil {
		count = *req.Rows
	}
	if err != nil || offset < 0 || count < 0 {
		return textReply(h, http.StatusBadRequest)
	}
	from, to := u.window(offset, count)
	res := grantsResult{
		Msg:  "Webservice Succeeds",
		Data: grantsData{HitCount: col.Records, StartRecord: offset, OppHits: make([]grantsOpp, 0, to-from)},
	}
	for i := from; i < to; i++ {
		rec := u.record(i)
		agency := agencies[rec.bits>>8%uint64(len(agencies))]
		res.Data.OppHits = append(res.Data.OppHits, grantsOpp{
			ID:         strconv.Itoa(350_000 + i),
			Number:     fmt.Sprintf("SIM-%s-%05d", agency, i+1),
			Title:      fmt.Sprintf("Simulated opportunity %d", i+1),
			AgencyCode: agency,
			OpenDate:   fmt.Sprintf("%02d/%02d/2026", 1+rec.bits>>16%12, 1+rec.bits>>24%28),
			OppStatus:  "posted",
			DocType:    "synopsis",
			CFDAList:   []string{fmt.Sprintf("%d.%03d", 10+rec.bits>>32%90, rec.bits>>40%1000)},
		})
	}
	return jsonReply(h, http.StatusOK, res)
}
