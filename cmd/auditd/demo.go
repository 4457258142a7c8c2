package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fetch"
	"github.com/auditd/auditd/registry"
	"github.com/auditd/auditd/sim"
)

// The demo (`auditd serve --demo testdata/scenarios/demo.yaml`, which is
// what `make run` does) serves the scenario's hostile upstreams on loopback,
// declares one source per upstream, and submits a morning refresh now and
// another while one county is down, so a newcomer with no internet sees
// 429s, waits, learned limits, a breaker trip and fallbacks to the last good
// copy within the first couple of minutes.

// demoSecondRunAfter is when the second run starts: inside maple-county's
// outage, after the first run has staged good copies of its layers.
const demoSecondRunAfter = 25 * time.Second

type demoUpstreams struct {
	sim  *sim.Sim
	urls map[string]string
	sc   *sim.Scenario
}

// demoSources are the operator's settings for the demo's upstreams: ceilings
// above what the servers really tolerate, so auditd has something to learn.
func demoSources(urls map[string]string) []auditd.Source {
	sec := func(n int) auditd.Duration { return auditd.Duration(time.Duration(n) * time.Second) }
	return []auditd.Source{
		{ID: "harris-county", BaseURL: urls["harris-county"], Limit: 5, Window: sec(1), BodyError: auditd.BodyErrorArcGIS},
		{ID: "travis-county", BaseURL: urls["travis-county"], Limit: 30, Window: sec(60), BodyError: auditd.BodyErrorArcGIS},
		{ID: "north-county", BaseURL: urls["north-county"], Group: "regional-gis", Limit: 4, Window: sec(1), BodyError: auditd.BodyErrorArcGIS},
		{ID: "south-county", BaseURL: urls["south-county"], Group: "regional-gis", Limit: 4, Window: sec(1), BodyError: auditd.BodyErrorArcGIS},
		{ID: "maple-county", BaseURL: urls["maple-county"], Limit: 5, Window: sec(1), MaxAttempts: 3,
			Breaker: auditd.BreakerPolicy{Threshold: 3, Cooldown: sec(20), Probes: 1}},
		{ID: "cedar-county", BaseURL: urls["cedar-county"], Limit: 3, Window: sec(1), RetryCap: sec(30)},
		{ID: "grants-gov", BaseURL: urls["grants-gov"], Limit: 3, Window: sec(1), BodyError: auditd.BodyErrorGrantsGov},
		{ID: "county-geocoder", BaseURL: urls["county-geocoder"], Limit: 10, Window: sec(1),
			Headers: map[string]string{"X-API-Key": "demo-key"}, SecretQuery: []string{"key"}},
	}
}

func startDemo(ctx context.Context, scenario string, loop *fetch.Loop, reg *registry.Registry) (*demoUpstreams, error) {
	sc, err := sim.LoadScenario(scenario)
	if err != nil {
		return nil, err
	}
	s, err := sim.New(sc, clock.Real{})
	if err != nil {
		return nil, err
	}
	urls, err := s.Start(ctx)
	if err != nil {
		return nil, err
	}
	d := &demoUpstreams{sim: s, urls: urls, sc: sc}
	fail := func(err error) (*demoUpstreams, error) {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d.close(cctx)
		return nil, err
	}
	_, err = reg.GetSource("maple-county")
	fresh := err != nil
	if err := applySources(ctx, loop, reg, demoSources(urls), "demo"); err != nil {
		return fail(err)
	}
	if fresh {
		// The operator knows Maple County's limit: the first run stages its
		// layers before the outage, so the second can fall back to them.
		if _, err := loop.SetLimit(ctx, "demo", "maple-county", 3, time.Second); err != nil {
			return fail(err)
		}
	}
	return d, nil
}

func (d *demoUpstreams) close(ctx context.Context) error {
	return d.sim.Close(ctx)
}

// demoItems is one refresh: a paged layer or two per county, a few geocodes
// and a Grants.gov search.
func demoItems(d *demoUpstreams) []auditd.Item {
	var items []auditd.Item
	layer := func(key, src string, paging auditd.Paging, size int, query string) {
		items = append(items, auditd.Item{Key: key, SourceID: src, Path: d.sim.Path(src) + query, Paging: paging, PageSize: size})
	}
	arcgis := "?where=1%3D1&outFields=*&f=json"
	wfs := "?service=WFS&version=2.0.0&request=GetFeature&outputFormat=application%2Fjson&typeNames="
	layer("harris/parcels", "harris-county", auditd.PagingArcGIS, 200, arcgis)
	layer("travis/zoning", "travis-county", auditd.PagingArcGIS, 100, arcgis)
	layer("north/permits", "north-county", auditd.PagingArcGIS, 100, arcgis)
	layer("south/permits", "south-county", auditd.PagingArcGIS, 100, arcgis)
	layer("maple/parcels", "maple-county", auditd.PagingWFS, 100, wfs+"parcels")
	layer("maple/parcels-2024", "maple-county", auditd.PagingWFS, 100, wfs+"parcels&year=2024")
	layer("cedar/zoning", "cedar-county", auditd.PagingWFS, 50, wfs+"zoning")
	items = append(items, auditd.Item{Key: "grants/broadband", SourceID: "grants-gov", Method: "POST", Path: d.sim.Path("grants-gov"),
		Body: []byte(`{"keyword":"broadband","oppStatuses":"forecasted|posted"}`), Paging: auditd.PagingGrantsGov, PageSize: 25})
	for i, addr := range []string{"100 Main St", "2 Court Sq", "55 Elm Ave", "9 River Rd", "410 Oak Blvd", "71 Pine Ct"} {
		items = append(items, auditd.Item{Key: fmt.Sprintf("geocode/%d", i+1), SourceID: "county-geocoder",
			Path: d.sim.Path("county-geocoder") + "?key=demo-secret&address=" + url.QueryEscape(addr)})
	}
	return items
}

// submitRuns submits the demo's two runs, unless an earlier start already did.
func (d *demoUpstreams) submitRuns(ctx context.Context, loop *fetch.Loop, log *slog.Logger) {
	award := auditd.Award{FAIN: "EMW-2026-GR-00417", ListingNumber: "97.067", ListingTitle: "Homeland Security Grant Program",
		AwardYear: 2026, Agency: "FEMA", PassThroughEntity: "Texas Division of Emergency Management", RecipientUEI: "ABCDEFGH1234"}
	submit := func(name, key string) {
		v, created, err := loop.Submit(ctx, auditd.NewRun{Name: name, Award: award, Items: demoItems(d),
			IdempotencyKey: key, Principal: "demo"})
		if err != nil {
			log.Error("demo run", "err", err)
			return
		}
		if created {
			log.Info("demo run submitted", "run", v.ID, "name", name, "items", v.ItemCount)
		}
	}
	submit("Morning refresh: parcels, zoning, permits, grants", "demo-run-1-"+d.sc.Name)
	t := time.NewTimer(demoSecondRunAfter)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	submit("Midday refresh during the Maple County outage", "demo-run-2-"+d.sc.Name)
}
