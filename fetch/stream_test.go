package fetch_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd"
)

// ndjsonPage is the NDJSON of n items from index from, with the keys of
// the lines in repeat (1-based) replaced by the key given.
func ndjsonPage(from, n int, repeat map[int]string) string {
	var b strings.Builder
	for i := range n {
		key := fmt.Sprintf("item-%06d", from+i)
		if k, ok := repeat[i+1]; ok {
			key = k
		}
		fmt.Fprintf(&b, `{"key":%q,"source":"fast","path":"/q?n=%d"}`+"\n", key, from+i)
	}
	return b.String()
}

// postNDJSON streams body to the items of run id and returns the status
// and the problem's field, if any.
func postNDJSON(t *testing.T, e *proxyEnv, id, body string, out any) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", e.srv.URL+"/v1/runs/"+id+"/items", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+e.token)
	req.Header.Set("Content-Type", "application/x-ndjson")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		var p struct {
			Field string `json:"field"`
		}
		json.NewDecoder(resp.Body).Decode(&p)
		return resp.StatusCode, p.Field
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, ""
}

// brokeOff sends body, chunked, as a streamed page of run id's items, and
// closes the connection without ending the body; it returns once the
// server has answered or closed the connection.
func brokeOff(t *testing.T, e *proxyEnv, id, body string) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/runs/%s/items HTTP/1.1\r\nHost: auditd\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", id, e.token, len(body), body)
	conn.(*net.TCPConn).CloseWrite()
	io.Copy(io.Discard, conn) // the answer, if any, then the close
}

// TestOpenBatchRunStreamedNDJSON: pages streamed as NDJSON, larger than a
// chunk, are the run's whole once they end; a page refused after some of
// its chunks were stored (a key the run has, a key an earlier line of the
// page has) names the line, and it and a page whose body breaks off leave
// nothing: not their items, not their keys, which a later page may then
// use. The run reconciles as one.
func TestOpenBatchRunStreamedNDJSON(t *testing.T) {
	up := fastUpstream(t)
	e := newProxyEnv(t, proxyEnvOptions{noSync: true, startLimit: 1_000_000})
	e.source(auditd.Source{ID: "fast", BaseURL: up.URL, Limit: 1_000_000, Window: auditd.Duration(time.Second), Burst: 100_000, Concurrency: 8})
	var run auditd.RunView
	if st := e.call("POST", "/v1/runs", `{"name":"streamed","open":true,"items":[]}`, &run); st != 201 {
		t.Fatalf("create open run: %d", st)
	}
	id := run.ID

	if st, field := postNDJSON(t, e, id, ndjsonPage(0, 2500, nil), &run); st != 200 || run.ItemCount != 2500 {
		t.Fatalf("a streamed page of 2,500: %d %q, %d items", st, field, run.ItemCount)
	}
	for _, tc := range []struct {
		name   string
		repeat map[int]string
		field  string
	}{
		{"KeyTheRunHas", map[int]string{1400: "item-000010"}, "line 1400: key"},
		{"KeyAnEarlierLineHas", map[int]string{1200: "item-002502"}, "line 1200: key"},
	} {
		if st, field := postNDJSON(t, e, id, ndjsonPage(2500, 1500, tc.repeat), nil); st != 400 || field != tc.field {
			t.Fatalf("%s: %d naming %q, want 400 naming %q", tc.name, st, field, tc.field)
		}
		v, err := e.store.Run(context.Background(), id)
		if err != nil || v.ItemCount != 2500 {
			t.Fatalf("%s: the refused page left %d items (%v), want 2,500", tc.name, v.ItemCount, err)
		}
		if st := e.call("GET", "/v1/runs/"+id+"/items/item-002504", "", nil); st != 404 {
			t.Fatalf("%s: an item of the refused page: %d, want 404", tc.name, st)
		}
	}
	// A body that breaks off after more than a chunk: nothing kept.
	brokeOff(t, e, id, ndjsonPage(2500, 1500, nil)[:80_000])
	if v, err := e.store.Run(context.Background(), id); err != nil || v.ItemCount != 2500 {
		t.Fatalf("a page that broke off left %d items (%v), want 2,500", v.ItemCount, err)
	}
	// The refused pages' keys are free.
	if st, field := postNDJSON(t, e, id, ndjsonPage(2500, 1200, nil), &run); st != 200 || run.ItemCount != 3700 {
		t.Fatalf("a page with the refused pages' keys: %d %q, %d items", st, field, run.ItemCount)
	}
	if st := e.call("POST", "/v1/runs/"+id+"/finish", "", nil); st != 200 {
		t.Fatalf("finish: %d", st)
	}
	v, err := e.loop.Wait(context.Background(), id)
	if err != nil || v.Status != auditd.RunSucceeded || v.Counts.Items != 3700 || v.Counts.Succeeded != 3700 {
		t.Fatalf("run %s: %+v (%v); want 3,700 succeeded", v.Status, v.Counts, err)
	}
	keys := listAllItems(t, e, id)
	if len(keys) != 3700 {
		t.Fatalf("listed %d items, want 3,700", len(keys))
	}
	for i, k := range keys {
		if want := fmt.Sprintf("item-%06d", i); k != want {
			t.Fatalf("item %d is %s, want %s (submission order)", i, k, want)
		}
	}
	if rep := e.reconcile(id); !rep.Balanced {
		t.Fatal("the streamed run does not reconcile as one")
	}
}
