package fetch

import (
	"bytes"
	"testing"
)

func rewriteAll(t testing.TB, base, proxy string, chunks ...[]byte) (string, int) {
	t.Helper()
	var out bytes.Buffer
	r := newURLRewriter(&out, base, proxy)
	for _, c := range chunks {
		if _, err := r.Write(c); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	return out.String(), r.n
}

func TestURLRewriter(t *testing.T) {
	const base, proxy = "https://gis.example.gov/geoserver/wfs/", "http://127.0.0.1:8080/proxy/county"
	for _, tc := range []struct {
		name, in, want string
		n              int
	}{
		{"OGCOperation", `<ows:Get xlink:href="https://gis.example.gov/geoserver/wfs?"/>`, `<ows:Get xlink:href="http://127.0.0.1:8080/proxy/county?"/>`, 1},
		{"PathBelow", `"url":"https://gis.example.gov/geoserver/wfs/x/y?f=json"`, `"url":"http://127.0.0.1:8080/proxy/county/x/y?f=json"`, 1},
		{"PlainHTTPToo", `href="http://gis.example.gov/geoserver/wfs"`, `href="http://127.0.0.1:8080/proxy/county"`, 1},
		{"JSONEscapedSlashes", `{"next":"https:\/\/gis.example.gov\/geoserver\/wfs\/p2"}`, `{"next":"http:\/\/127.0.0.1:8080\/proxy\/county\/p2"}`, 1},
		{"XMLEscapedQuery", `href="https://gis.example.gov/geoserver/wfs&amp;x=1"`, `href="http://127.0.0.1:8080/proxy/county&amp;x=1"`, 1},
		{"AtTheEnd", `https://gis.example.gov/geoserver/wfs`, `http://127.0.0.1:8080/proxy/county`, 1},
		{"LongerSegmentLeftAlone", `https://gis.example.gov/geoserver/wfs2?`, `https://gis.example.gov/geoserver/wfs2?`, 0},
		{"OtherHostLeftAlone", `https://tiles.example.com/geoserver/wfs?`, `https://tiles.example.com/geoserver/wfs?`, 0},
		{"OtherPortLeftAlone", `https://gis.example.gov:8443/geoserver/wfs`, `https://gis.example.gov:8443/geoserver/wfs`, 0},
		{"HostOnlyLeftAlone", `https://gis.example.gov/other`, `https://gis.example.gov/other`, 0},
		{"Many", `https://gis.example.gov/geoserver/wfs https://gis.example.gov/geoserver/wfs/a httpx http`, `http://127.0.0.1:8080/proxy/county http://127.0.0.1:8080/proxy/county/a httpx http`, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, n := rewriteAll(t, base, proxy, []byte(tc.in))
			if got != tc.want || n != tc.n {
				t.Fatalf("got %q (%d), want %q (%d)", got, n, tc.want, tc.n)
			}
			// Byte by byte, as a slow upstream streams it: the same.
			var chunks [][]byte
			for i := range len(tc.in) {
				chunks = append(chunks, []byte{tc.in[i]})
			}
			if got, n := rewriteAll(t, base, proxy, chunks...); got != tc.want || n != tc.n {
				t.Fatalf("byte by byte: got %q (%d), want %q (%d)", got, n, tc.want, tc.n)
			}
		})
	}
}

// However a body is cut into writes, the rewrite is the same as of the
// whole.
func FuzzURLRewriter(f *testing.F) {
	f.Add([]byte(`<a href="https://h.example/wfs?x">https://h.example/wfs2 http://h.example/wfs</a>`), uint8(7))
	f.Add([]byte(`{"next":"https:\/\/h.example\/wfs\/2"}`), uint8(13))
	f.Fuzz(func(t *testing.T, body []byte, cut uint8) {
		const base, proxy = "https://h.example/wfs", "http://a:1/proxy/s"
		whole, n := rewriteAll(t, base, proxy, body)
		step := int(cut)%17 + 1
		var chunks [][]byte
		for i := 0; i < len(body); i += step {
			chunks = append(chunks, body[i:min(len(body), i+step)])
		}
		if got, m := rewriteAll(t, base, proxy, chunks...); got != whole || m != n {
			t.Fatalf("in writes of %d: %q (%d), whole: %q (%d)", step, got, m, whole, n)
		}
	})
}
