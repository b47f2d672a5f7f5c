package collect_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/gymfleet/gymfleet/pkg/ops/collect"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

func ep(id string, a int) rollout.EpisodeID { return rollout.EpisodeID{RolloutID: id, Attempt: a} }

// rowsOf reads rows with the given ids (and attempts, via "id@attempt").
func rowsOf(t *testing.T, specs ...string) []collect.Row {
	t.Helper()
	var lines []string
	for _, s := range specs {
		id, attempt, _ := strings.Cut(s, "@")
		line := `{"responses_create_params":{},"_ng_rollout_id":"` + id + `"`
		if attempt != "" {
			line += `,"_ng_attempt_index":` + attempt
		}
		lines = append(lines, line+"}")
	}
	rows, issues, err := collect.ReadRows(strings.NewReader(strings.Join(lines, "\n")), 0)
	if err != nil || len(issues) > 0 {
		t.Fatalf("rows: %v %v", issues, err)
	}
	return rows
}

func TestPlanResume(t *testing.T) {
	latest := func(run string, continued ...rollout.EpisodeID) *collect.CollectionManifest {
		return &collect.CollectionManifest{CheckpointID: "ckpt-20260101T000000-0123abcd", RunID: run, Continued: continued}
	}
	log := func(run string, attempts map[string]int) *collect.DispatchLog {
		return &collect.DispatchLog{RunID: run, Attempts: attempts}
	}
	tests := []struct {
		name     string
		rows     []string
		finished []string
		log      *collect.DispatchLog
		latest   *collect.CollectionManifest
		want     collect.ResumePlan
		ignored  string // substring of LatestIgnored
	}{
		{
			name: "nothing before: every row at its own attempt",
			rows: []string{"a", "b@2"},
			want: collect.ResumePlan{Next: map[string]int{"a": 0, "b": 2}, Carry: map[string]int{}},
		},
		{
			name:     "LATEST of the previous run: continued rows restore as attempt + 1, other sent rows are retired and start over, finished rows stay",
			rows:     []string{"done", "cont", "cont-done", "sent", "sent-late@5", "never"},
			finished: []string{"done", "cont-done"},
			log:      log("run1", map[string]int{"done": 0, "cont": 0, "cont-done": 0, "sent": 1, "sent-late": 2}),
			latest:   latest("run1", ep("cont", 0), ep("cont-done", 0)),
			want: collect.ResumePlan{
				CheckpointID: "ckpt-20260101T000000-0123abcd",
				Restore:      []rollout.EpisodeID{ep("cont", 0)},
				Retire:       []rollout.EpisodeID{ep("sent", 1), ep("sent-late", 2)},
				Next:         map[string]int{"cont": 1, "sent": 2, "sent-late": 5, "never": 0},
				Carry:        map[string]int{"cont": 1, "sent": 1, "sent-late": 2},
				Finished:     2,
			},
		},
		{
			name:    "LATEST of an older run: nothing is restored, every sent row starts over",
			rows:    []string{"cont", "sent"},
			log:     log("run2", map[string]int{"cont": 1, "sent": 0}),
			latest:  latest("run1", ep("cont", 0)),
			ignored: "belongs to run run1, not to the previous run run2",
			want: collect.ResumePlan{
				Retire: []rollout.EpisodeID{ep("cont", 1), ep("sent", 0)},
				Next:   map[string]int{"cont": 2, "sent": 1},
				Carry:  map[string]int{"cont": 1, "sent": 0},
			},
		},
		{
			name:    "a torn log header: no run to match, nothing restored",
			rows:    []string{"cont"},
			log:     log("", map[string]int{}),
			latest:  latest("run1", ep("cont", 0)),
			ignored: "no previous dispatch log",
			want:    collect.ResumePlan{Next: map[string]int{"cont": 0}, Carry: map[string]int{}},
		},
		{
			name:   "a continued row started over after the checkpoint is not restored",
			rows:   []string{"cont"},
			log:    log("run1", map[string]int{"cont": 1}),
			latest: latest("run1", ep("cont", 0)),
			want: collect.ResumePlan{
				Retire: []rollout.EpisodeID{ep("cont", 1)},
				Next:   map[string]int{"cont": 2},
				Carry:  map[string]int{"cont": 1},
			},
		},
		{
			name:   "a restored row not yet re-sent is continued by its replacement attempt",
			rows:   []string{"cont"},
			log:    log("run2", map[string]int{"cont": 1}),
			latest: latest("run2", ep("cont", 1)),
			want: collect.ResumePlan{
				CheckpointID: "ckpt-20260101T000000-0123abcd",
				Restore:      []rollout.EpisodeID{ep("cont", 1)},
				Next:         map[string]int{"cont": 2},
				Carry:        map[string]int{"cont": 2},
			},
		},
		{
			name:   "an input that now names a later attempt starts over from it",
			rows:   []string{"cont@7"},
			log:    log("run1", map[string]int{"cont": 0}),
			latest: latest("run1", ep("cont", 0)),
			want: collect.ResumePlan{
				Retire: []rollout.EpisodeID{ep("cont", 0)},
				Next:   map[string]int{"cont": 7},
				Carry:  map[string]int{"cont": 0},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			finished := map[string]bool{}
			for _, id := range tc.finished {
				finished[id] = true
			}
			got := collect.PlanResume(collect.ResumeState{Rows: rowsOf(t, tc.rows...), Finished: finished, Log: tc.log, Latest: tc.latest})
			if !strings.Contains(got.LatestIgnored, tc.ignored) || (tc.ignored == "" && got.LatestIgnored != "") {
				t.Errorf("LatestIgnored = %q, want %q", got.LatestIgnored, tc.ignored)
			}
			got.LatestIgnored = ""
			if got.CheckpointID != tc.want.CheckpointID || !slices.Equal(got.Restore, tc.want.Restore) || !slices.Equal(got.Retire, tc.want.Retire) ||
				!maps.Equal(got.Next, tc.want.Next) || !maps.Equal(got.Carry, tc.want.Carry) || got.Finished != tc.want.Finished {
				t.Errorf("plan\n got  %+v\n want %+v", got, tc.want)
			}
		})
	}
}

func TestResumePlan_RestoreFailed(t *testing.T) {
	p := collect.PlanResume(collect.ResumeState{
		Rows:   rowsOf(t, "cont", "sent"),
		Log:    &collect.DispatchLog{RunID: "run1", Attempts: map[string]int{"cont": 3, "sent": 0}},
		Latest: &collect.CollectionManifest{CheckpointID: "ckpt-20260101T000000-0123abcd", RunID: "run1", Continued: []rollout.EpisodeID{ep("cont", 3)}},
	})
	p.RestoreFailed()
	if p.CheckpointID != "" || len(p.Restore) != 0 {
		t.Errorf("still restoring: %+v", p)
	}
	if want := []rollout.EpisodeID{ep("sent", 0), ep("cont", 3), ep("cont", 4)}; !slices.Equal(p.Retire, want) {
		t.Errorf("retire %v, want %v", p.Retire, want)
	}
	if p.Next["cont"] != 5 || p.Next["sent"] != 1 || p.Carry["cont"] != 4 {
		t.Errorf("next %v carry %v: want cont at attempt + 2 (5), its carried attempt + 1 (4)", p.Next, p.Carry)
	}
	if r := p.Restarts(); len(r) != 2 || !r["cont"] || !r["sent"] {
		t.Errorf("restarts %v", r)
	}
}

func TestScanOutput(t *testing.T) {
	in := `{"_ng_rollout_id":"a","reward":1}` + "\n" + "\n" + `{"_ng_rollout_id":"b"}` + "\n" + `{"_ng_rollout_id":"c","rew`
	finished, complete, err := collect.ScanOutput(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(finished, map[string]bool{"a": true, "b": true}) || complete != int64(strings.LastIndex(in, "\n")+1) {
		t.Errorf("finished %v complete %d", finished, complete)
	}
	if _, _, err := collect.ScanOutput(strings.NewReader(`{"_ng_rollout_id":"a"}` + "\nnot json\n")); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("a bad complete line: %v", err)
	}
	if _, _, err := collect.ScanOutput(strings.NewReader(`{"reward":1}` + "\n")); err == nil {
		t.Error("a row without a rollout id was accepted")
	}
}

// Over any previous run, the plan sends every unfinished row exactly once,
// never a finished one, never below its own attempt, always above every
// attempt it fences, and restores only the previous run's continued rows.
func TestPlanResume_Properties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(0, 12).Draw(rt, "rows")
		var specs []string
		for i := 0; i < n; i++ {
			specs = append(specs, fmt.Sprintf("r%d@%d", i, rapid.IntRange(0, 3).Draw(rt, "own")))
		}
		rows := rowsOf(t, specs...)
		finished := map[string]bool{}
		logged := map[string]int{}
		var continued []rollout.EpisodeID
		for _, r := range rows {
			id := r.Episode.RolloutID
			finished[id] = rapid.Bool().Draw(rt, "finished")
			if rapid.Bool().Draw(rt, "logged") {
				logged[id] = rapid.IntRange(0, 4).Draw(rt, "logged attempt")
				if rapid.Bool().Draw(rt, "continued") {
					continued = append(continued, ep(id, logged[id]-rapid.IntRange(0, 1).Draw(rt, "lag")))
				}
			}
		}
		run := rapid.SampledFrom([]string{"run1", "run2"}).Draw(rt, "latest run")
		var latest *collect.CollectionManifest
		if rapid.Bool().Draw(rt, "has latest") {
			latest = &collect.CollectionManifest{CheckpointID: "ckpt-20260101T000000-0123abcd", RunID: run, Continued: continued}
		}
		p := collect.PlanResume(collect.ResumeState{Rows: rows, Finished: finished, Log: &collect.DispatchLog{RunID: "run1", Attempts: logged}, Latest: latest})
		if rapid.Bool().Draw(rt, "restore fails") {
			p.RestoreFailed()
		}
		for _, r := range rows {
			id := r.Episode.RolloutID
			next, sent := p.Next[id]
			if finished[id] == sent {
				rt.Fatalf("%s: finished %v but sent %v", id, finished[id], sent)
			}
			if !sent {
				continue
			}
			if next < r.Episode.Attempt {
				rt.Fatalf("%s sent as %d, below its own attempt %d", id, next, r.Episode.Attempt)
			}
			if a, ok := logged[id]; ok && next <= a {
				rt.Fatalf("%s sent as %d, not above the logged attempt %d", id, next, a)
			}
		}
		for _, e := range p.Retire {
			if p.Next[e.RolloutID] <= e.Attempt {
				rt.Fatalf("%s is fenced at %d and sent as %d", e.RolloutID, e.Attempt, p.Next[e.RolloutID])
			}
		}
		for _, e := range p.Restore {
			if latest == nil || latest.RunID != "run1" || !slices.Contains(latest.Continued, e) || p.Next[e.RolloutID] != e.Attempt+1 {
				rt.Fatalf("restores %v (next %d) from %+v", e, p.Next[e.RolloutID], latest)
			}
		}
	})
}
