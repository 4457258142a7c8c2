package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/internal/nginxtest"
)

// Client libraries nobody at auditd wrote, driven through the proxy route
// as docs/PROXY.md says: geopy's Nominatim geocoder and OWSLib's
// WebFeatureService (Debian's python3-geopy and python3-owslib,
// testdata/proxy/services.py), against nginx upstreams the sources were
// not told about (testdata/proxy/services.conf.tmpl).

// pythonWith returns Debian's python3 when it can import modules; the
// test is skipped without them, except in CI (.ci/run installs them).
func pythonWith(tb testing.TB, modules ...string) string {
	tb.Helper()
	const bin = "/usr/bin/python3"
	if out, err := exec.Command(bin, "-c", "import "+strings.Join(modules, ", ")).CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("%s with %v is needed (.ci/run installs them): %v\n%s", bin, modules, err, out)
		}
		tb.Skipf("%s with %v is not installed: %v\n%s", bin, modules, err, out)
	}
	return bin
}

// serviceResult is what testdata/proxy/services.py printed.
type serviceResult struct {
	Found          int      `json:"found"`
	Types          []string `json:"types"`
	GetFeatureURLs []string `json:"getfeature_urls"`
	Features       int      `json:"features"`
	Errors         int      `json:"errors"`
	ErrorTexts     []string `json:"error_texts"`
}

func runService(tb testing.TB, py, what, base, token, run, source string, n int) serviceResult {
	tb.Helper()
	script, err := filepath.Abs(filepath.Join("..", "..", "testdata", "proxy", "services.py"))
	if err != nil {
		tb.Fatal(err)
	}
	out, err := exec.Command(py, script, what, "--base", base, "--token", token, "--run", run, "--source", source,
		"--n", fmt.Sprint(n)).CombinedOutput()
	if err != nil {
		tb.Fatalf("services.py %s: %v\n%s", what, err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var r serviceResult
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		tb.Fatalf("services.py %s printed %q: %v", what, out, err)
	}
	return r
}

// capabilities is a WFS 1.1.0 capabilities document whose operations name
// the server's own URL, base, as servers do.
func capabilities(base string) string {
	op := func(name string) string {
		return `<ows:Operation name="` + name + `"><ows:DCP><ows:HTTP><ows:Get xlink:href="` + base + `/county/wfs?"/>` +
			`<ows:Post xlink:href="` + base + `/county/wfs"/></ows:HTTP></ows:DCP></ows:Operation>`
	}
	return `<?xml version="1.0" encoding="UTF-8"?>
<wfs:WFS_Capabilities version="1.1.0" xmlns:wfs="http://www.opengis.net/wfs" xmlns:ows="http://www.opengis.net/ows"
 xmlns:ogc="http://www.opengis.net/ogc" xmlns:xlink="http://www.w3.org/1999/xlink" xmlns:gml="http://www.opengis.net/gml"
 xmlns:county="http://county.example/ns">
<ows:ServiceIdentification><ows:Title>County parcels</ows:Title><ows:Abstract/><ows:ServiceType>WFS</ows:ServiceType>
<ows:ServiceTypeVersion>1.1.0</ows:ServiceTypeVersion><ows:Fees>NONE</ows:Fees><ows:AccessConstraints>NONE</ows:AccessConstraints></ows:ServiceIdentification>
<ows:ServiceProvider><ows:ProviderName>County GIS</ows:ProviderName></ows:ServiceProvider>
<ows:OperationsMetadata>` + op("GetCapabilities") + op("DescribeFeatureType") + op("GetFeature") + `</ows:OperationsMetadata>
<wfs:FeatureTypeList><wfs:Operations><wfs:Operation>Query</wfs:Operation></wfs:Operations>
<wfs:FeatureType><wfs:Name>county:parcels</wfs:Name><wfs:Title>Parcels</wfs:Title><wfs:Abstract/>
<wfs:DefaultSRS>urn:x-ogc:def:crs:EPSG:4326</wfs:DefaultSRS>
<wfs:OutputFormats><wfs:Format>text/xml; subtype=gml/3.1.1</wfs:Format></wfs:OutputFormats>
<ows:WGS84BoundingBox><ows:LowerCorner>-122 38</ows:LowerCorner><ows:UpperCorner>-121 39</ows:UpperCorner></ows:WGS84BoundingBox>
</wfs:FeatureType></wfs:FeatureTypeList>
</wfs:WFS_Capabilities>
`
}

// features is a GetFeature answer of ten parcels.
func features() string {
	var b strings.Builder
	b.WriteString(`<?xml version="1.0" encoding="UTF-8"?><wfs:FeatureCollection xmlns:wfs="http://www.opengis.net/wfs" xmlns:gml="http://www.opengis.net/gml" xmlns:county="http://county.example/ns">`)
	for i := range 10 {
		fmt.Fprintf(&b, `<gml:featureMember><county:parcels gml:id="parcels.%d"><county:apn>%03d</county:apn></county:parcels></gml:featureMember>`, i, i)
	}
	b.WriteString(`</wfs:FeatureCollection>`)
	return b.String()
}

// geopy geocodes through a geocoder that allows 1 request a second and
// answers 429 with Retry-After beyond it: every address is found and no
// call raises. OWSLib reads capabilities that name the WFS's own host and
// pages GetFeature through a silent limit answered by plain 503s: every
// page arrives, and every GetFeature goes through auditd (nginx logged no
// request without the header only auditd adds). nginx logged exactly the
// ledger's dispatches, and the run reconciles.
func TestProxyClientLibraries(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nginx, auditd and Python clients")
	}
	py := pythonWith(t, "geopy", "owslib")
	gw := nginxtest.Start(t, nginxtest.Config{Template: "testdata/proxy/services.conf.tmpl", Rate: 5, Burst: 1})
	for name, body := range map[string]string{
		"nominatim.json": `[{"place_id":101,"licence":"test","osm_type":"way","osm_id":1,"lat":"38.5767","lon":"-121.4934",` +
			`"display_name":"Capitol Mall, Sacramento, CA","class":"building","type":"yes","importance":0.5,"boundingbox":["38.57","38.58","-121.50","-121.49"]}]`,
		"caps.xml":     capabilities(gw.URL),
		"features.xml": features(),
	} {
		if err := os.WriteFile(filepath.Join(gw.Dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	config := writeConfig(t, dir, fmt.Sprintf(`sources:
  - id: geo
    base_url: %[1]s/geo
    headers: {X-Via: auditd}
  - id: county
    base_url: %[1]s/county
    headers: {X-Via: auditd}
`, gw.URL))
	const token = "proxy-clients-admin-token-0123456789"
	srv := startServe(t, filepath.Join(dir, "data"), config, token)
	id := srv.proxyRun(t, token)

	const addresses, pages = 6, 8
	geo := runService(t, py, "geocode", srv.url, token, id, "geo", addresses)
	if geo.Found != addresses || geo.Errors > 0 {
		t.Errorf("geopy: %+v, want %d found and no exception", geo, addresses)
	}
	wfs := runService(t, py, "wfs", srv.url, token, id, "county", pages)
	if wfs.Features != 10*pages || wfs.Errors > 0 || fmt.Sprint(wfs.Types) != "[county:parcels]" {
		t.Errorf("OWSLib: %+v, want %d features and no exception", wfs, 10*pages)
	}
	for _, u := range wfs.GetFeatureURLs {
		if !strings.HasPrefix(u, srv.url+"/proxy/county/") {
			t.Errorf("OWSLib's GetFeature URL %s is not on the proxy", u)
		}
	}

	var fin runCounts
	if code := srv.call(t, "POST", "/v1/runs/"+id+"/finish", token, nil, &fin); code != http.StatusOK {
		t.Fatalf("finish: %d", code)
	}
	gw.Stop(t)
	lines := gatewayLog(t, gw)
	direct, statuses := 0, map[int]int{}
	for _, l := range lines {
		statuses[l.status]++
		if !strings.Contains(l.line, `"auditd"`) {
			direct++
			t.Logf("around auditd: %s", l.line)
		}
	}
	t.Logf("nginx logged %d requests %v; the ledger holds %d dispatches; run %s %+v", len(lines), statuses, fin.Counts.Dispatches, fin.Status, fin.Counts)
	if direct > 0 {
		t.Errorf("%d requests reached nginx without going through auditd", direct)
	}
	if len(lines) != fin.Counts.Dispatches || fin.Status != string(auditd.RunSucceeded) {
		t.Errorf("nginx logged %d requests, the ledger holds %d dispatches; run %s", len(lines), fin.Counts.Dispatches, fin.Status)
	}
	var table strings.Builder
	if code := run(context.Background(), []string{"reconcile", "--server", srv.url, "--run", id, "--token", token}, &table, &table); code != 0 {
		t.Errorf("auditd reconcile --server exited %d:\n%s", code, table.String())
	}
}
