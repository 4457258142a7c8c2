package fetch_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd"
)

// A service document that names its own server's URLs keeps a client on
// the proxy: the source's base URL becomes its proxy URL in what the
// client gets, while the upstream's body is what is staged and hashed,
// and the response's record says how many URLs were rewritten. A source
// with rewrite_urls false passes the body as sent, and so does a type
// that is not text.
func TestProxyRewritesServiceURLs(t *testing.T) {
	var base string
	doc := func() string {
		return `<?xml version="1.0"?><wfs:WFS_Capabilities><ows:Operation name="GetFeature"><ows:DCP><ows:HTTP>` +
			`<ows:Get xlink:href="` + base + `/wfs?"/></ows:HTTP></ows:DCP></ows:Operation>` +
			`<ows:Get xlink:href="https://elsewhere.example/wfs?"/></wfs:WFS_Capabilities>`
	}
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		if r.URL.Path == "/bin" {
			w.Header().Set("Content-Type", "application/octet-stream")
		} else {
			w.Header().Set("Content-Type", "text/xml; charset=utf-8")
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(doc())))
		fmt.Fprint(w, doc())
	})
	base = up.URL
	e := newProxyEnv(t, proxyEnvOptions{noSync: true})
	off := false
	e.source(auditd.Source{ID: "wfs", BaseURL: up.URL, Limit: 1000, Window: auditd.Duration(time.Second)})
	e.source(auditd.Source{ID: "asis", BaseURL: up.URL, Limit: 1000, Window: auditd.Duration(time.Second),
		Proxy: auditd.ProxyPolicy{RewriteURLs: &off}})
	id := e.proxyRun("")

	r := e.send("GET", id, "/proxy/wfs/wfs?service=WFS&request=GetCapabilities", nil, nil)
	want := strings.Replace(doc(), up.URL, e.srv.URL+"/proxy/wfs", 1)
	if r.status != 200 || string(r.body) != want {
		t.Fatalf("capabilities through the proxy: %d\n%s\nwant\n%s", r.status, r.body, want)
	}
	for _, path := range []string{"/proxy/asis/wfs", "/proxy/wfs/bin"} {
		if r := e.send("GET", id, path, nil, nil); r.status != 200 || string(r.body) != doc() {
			t.Errorf("%s: %d %s, want the body as sent", path, r.status, r.body)
		}
	}
	e.finish(id)
	sum := sha256.Sum256([]byte(doc()))
	staged, rewrites := 0, 0
	for _, ev := range e.events(id) {
		switch {
		case ev.Type == auditd.EventPayloadStaged:
			staged++
			if ev.PayloadHash != hex.EncodeToString(sum[:]) {
				t.Errorf("%s staged %s, not the upstream's body", ev.ItemKey, ev.PayloadHash)
			}
		case ev.Type == auditd.EventResponse && ev.Detail != "":
			rewrites++
			if ev.Detail != `{"urls_rewritten":1}` || !strings.Contains(ev.ItemKey, "/wfs?service") {
				t.Errorf("%s: response Detail %s", ev.ItemKey, ev.Detail)
			}
		}
	}
	if staged != 3 || rewrites != 1 {
		t.Errorf("staged %d, rewrites recorded %d; want 3 and 1", staged, rewrites)
	}
	e.reconcile(id)
}
