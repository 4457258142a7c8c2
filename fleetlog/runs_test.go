package fleetlog_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/auditd/auditd/fleetlog"
	"github.com/auditd/auditd/internal/etcdtest"
)

// A fleet run is created once, found from any node with the parts that
// joined it, and each node's API address is published for the others.
func TestFleetRuns(t *testing.T) {
	ctx := context.Background()
	c := etcdtest.Start(t, 1)
	a := fleetlog.NewRuns(etcdtest.NewClient(t, c.Endpoints()...), "")
	b := fleetlog.NewRuns(etcdtest.NewClient(t, c.Endpoints()...), "")
	run := fleetlog.Run{ID: "01JFLEETRUN000000000000000", Name: "pipeline", Node: "a", InitiatedBy: "op", CreatedAt: time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC), IdleTimeout: time.Minute}
	if err := a.Create(ctx, run); err != nil {
		t.Fatal(err)
	}
	if err := b.Create(ctx, run); !errors.Is(err, fleetlog.ErrRunExists) {
		t.Errorf("a second create of the run: %v, want ErrRunExists", err)
	}
	if err := b.Join(ctx, run.ID, "b"); err != nil {
		t.Fatal(err)
	}
	if err := b.Join(ctx, run.ID, "b"); err != nil { // again: harmless
		t.Fatal(err)
	}
	if err := b.Join(ctx, run.ID, "no/slash"); err == nil {
		t.Error("a node name with a slash joined")
	}
	got, ok, err := b.Get(ctx, run.ID)
	if err != nil || !ok {
		t.Fatalf("get: %v %v", ok, err)
	}
	if !slices.Equal(got.Parts, []string{"a", "b"}) || got.Name != "pipeline" || got.IdleTimeout != time.Minute || got.InitiatedBy != "op" {
		t.Errorf("the run as node b finds it: %+v", got)
	}
	if _, ok, err := a.Get(ctx, "01JNOSUCHRUN00000000000000"); ok || err != nil {
		t.Errorf("an unknown run: %v %v", ok, err)
	}
	for node, url := range map[string]string{"a": "http://10.0.0.1:8080", "b": "http://10.0.0.2:8080"} {
		if err := a.SetPeer(ctx, node, url); err != nil {
			t.Fatal(err)
		}
	}
	peers, err := b.Peers(ctx)
	if err != nil || len(peers) != 2 || peers["b"] != "http://10.0.0.2:8080" {
		t.Errorf("peers: %v %v", peers, err)
	}
}

// Fleet runs are listed newest first, a page at a time, each with the
// parts that joined it and no other run's.
func TestFleetRunsList(t *testing.T) {
	ctx := context.Background()
	c := etcdtest.Start(t, 1)
	dir := fleetlog.NewRuns(etcdtest.NewClient(t, c.Endpoints()...), "")
	ids := []string{"01JFLEETRUN000000000000001", "01JFLEETRUN000000000000002", "01JFLEETRUN000000000000003", "01JFLEETRUN000000000000004", "01JFLEETRUN000000000000005"}
	for i, id := range ids {
		if err := dir.Create(ctx, fleetlog.Run{ID: id, Name: "run", Node: "a", CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if err := dir.Join(ctx, id, "c"); err != nil {
				t.Fatal(err)
			}
		}
	}
	var seen []string
	before := ""
	for range len(ids) {
		page, err := dir.List(ctx, before, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, run := range page {
			want := []string{"a"}
			if i := slices.Index(ids, run.ID); i%2 == 0 {
				want = []string{"a", "c"}
			}
			if !slices.Equal(run.Parts, want) || run.Name != "run" {
				t.Errorf("listed %+v, want parts %v", run, want)
			}
			seen = append(seen, run.ID)
		}
		before = page[len(page)-1].ID
	}
	want := slices.Clone(ids)
	slices.Reverse(want)
	if !slices.Equal(seen, want) {
		t.Errorf("listed %v, want every run newest first: %v", seen, want)
	}
	// Which of many ids are fleet runs, in reads of 64 keys.
	many := slices.Clone(ids)
	for i := range 150 {
		many = append(many, fmt.Sprintf("01JNOTAFLEETRUN%011d", i))
	}
	exist, err := dir.Exist(ctx, many)
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range many {
		if exist[id] != (i < len(ids)) {
			t.Errorf("Exist(%s) = %t", id, exist[id])
		}
	}
}

// A fleet run finished once stays finished at its first finish, shows it
// in Get and List, and no node joins it after.
func TestFleetRunFinish(t *testing.T) {
	ctx := context.Background()
	c := etcdtest.Start(t, 1)
	dir := fleetlog.NewRuns(etcdtest.NewClient(t, c.Endpoints()...), "")
	run := fleetlog.Run{ID: "01JFLEETRUN000000000000009", Name: "run", Node: "a", CreatedAt: time.Now()}
	if err := dir.Create(ctx, run); err != nil {
		t.Fatal(err)
	}
	if err := dir.Join(ctx, run.ID, "b"); err != nil {
		t.Fatal(err)
	}
	first := time.Date(2026, 12, 5, 21, 0, 0, 0, time.UTC)
	if at, err := dir.Finish(ctx, run.ID, first); err != nil || !at.Equal(first) {
		t.Fatalf("finish: %v %v", at, err)
	}
	if at, err := dir.Finish(ctx, run.ID, first.Add(time.Hour)); err != nil || !at.Equal(first) {
		t.Errorf("a second finish: %v %v, want the first's time", at, err)
	}
	if err := dir.Join(ctx, run.ID, "c"); !errors.Is(err, fleetlog.ErrRunFinished) {
		t.Errorf("a join after the finish: %v, want ErrRunFinished", err)
	}
	if err := dir.Join(ctx, run.ID, "b"); !errors.Is(err, fleetlog.ErrRunFinished) {
		t.Errorf("a join again of a part after the finish: %v, want ErrRunFinished", err)
	}
	got, ok, err := dir.Get(ctx, run.ID)
	if err != nil || !ok || !got.FinishedAt.Equal(first) || !slices.Equal(got.Parts, []string{"a", "b"}) {
		t.Errorf("get: %+v %v %v", got, ok, err)
	}
	list, err := dir.List(ctx, "", 10)
	if err != nil || len(list) != 1 || !list[0].FinishedAt.Equal(first) {
		t.Errorf("list: %+v %v", list, err)
	}
}
