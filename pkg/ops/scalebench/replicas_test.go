package scalebench

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/wire/replica"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Ensure the bench's fleet with two replicas runs two processes of every
// participant kind and one shared fakeinference, and with one keeps the
// names the reports and checkpoints have always used.
func TestBenchTopology_Replicas(t *testing.T) {
	for _, tc := range []struct {
		replicas int
		want     []string
	}{
		{0, []string{"fakeinference", "policy_model", "resources", "agents", "env"}},
		{2, []string{"fakeinference", "policy_model-0", "policy_model-1", "resources-0", "resources-1", "agents-0", "agents-1", "env-0", "env-1"}},
	} {
		dir := t.TempDir()
		topo := benchTopology(Options{Replicas: tc.replicas}, dir, filepath.Join(dir, "fleet"), filepath.Join(dir, "ckpt"))
		cfg, err := fleet.Generate(topo)
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.Names(); !slices.Equal(got, tc.want) {
			t.Errorf("replicas %d: processes %v, want %v", tc.replicas, got, tc.want)
		}
		n := max(tc.replicas, 1)
		for _, kind := range []string{fleet.KindEnvironment, fleet.KindAgent, fleet.KindResources, fleet.KindModel} {
			if got := len(cfg.Endpoints(kind)); got != n {
				t.Errorf("replicas %d: %d %s endpoints, want %d", tc.replicas, got, kind, n)
			}
		}
		if got := len(cfg.Endpoints(fleet.KindFakeInference)); got != 1 {
			t.Errorf("replicas %d: %d fakeinference processes, want one shared", tc.replicas, got)
		}
	}
}

// Ensure dispatch spreads rollouts over the environment replicas by
// replica.Pick, and a replacement attempt reaches the replica its
// rollout's original went to.
func TestDispatch_SpreadsOverEnvReplicas(t *testing.T) {
	var mu sync.Mutex
	seen := map[string][]int{} // rollout id -> replica per attempt
	var urls []string
	for i := range 2 {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var row map[string]any
			if err := json.NewDecoder(r.Body).Decode(&row); err != nil {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			mu.Lock()
			id := row[rollout.FieldRolloutID].(string)
			seen[id] = append(seen[id], i)
			mu.Unlock()
			_, _ = w.Write([]byte(`{"reward": 1.0}`))
		}))
		defer srv.Close()
		urls = append(urls, srv.URL)
	}
	client := httpclient.New(httpclient.Options{})
	rows := weatherRows(64)
	for attempt := range 2 {
		b := dispatch(context.Background(), client, runRouter(urls), rows, attempt)
		if err := b.wait(context.Background(), time.Minute); err != nil {
			t.Fatal(err)
		}
		b.close()
		if s := b.summary(); s.ok != len(rows) {
			t.Fatalf("attempt %d: %+v, want every call answered", attempt, s)
		}
	}
	per := make([]int, 2)
	for _, r := range rows {
		want := replica.Pick(r.id, 2)
		if got := seen[r.id]; !slices.Equal(got, []int{want, want}) {
			t.Errorf("%s went to replicas %v, want %d for both attempts", r.id, got, want)
		}
		per[want]++
	}
	if per[0] == 0 || per[1] == 0 {
		t.Errorf("rollouts per replica %v: want both replicas used", per)
	}
}

func replicatedResult() *Result {
	r := sampleResult()
	r.Replicas = 2
	r.Processes = []ProcessStat{
		{Name: "env-0", Kind: fleet.KindEnvironment, Fleet: "first", PeakRSSBytes: 300 << 20, FDsAtBoundary: 10, PeakFDs: 70, CPUSeconds: 6, StackBytesAtBoundary: 100 << 20, GoroutinesAtBoundary: 16000},
		{Name: "env-1", Kind: fleet.KindEnvironment, Fleet: "first", PeakRSSBytes: 200 << 20, FDsAtBoundary: 12, PeakFDs: 60, CPUSeconds: 4, StackBytesAtBoundary: 50 << 20, GoroutinesAtBoundary: 15000},
		{Name: "agents-0", Kind: fleet.KindAgent, Fleet: "first", PeakRSSBytes: 100 << 20, FDsAtBoundary: 5},
		{Name: "fakeinference", Kind: fleet.KindFakeInference, Fleet: "kept", PeakRSSBytes: 600 << 20},
		{Name: "env-0", Kind: fleet.KindEnvironment, Fleet: "fresh", PeakRSSBytes: 250 << 20},
		{Name: "env-1", Kind: fleet.KindEnvironment, Fleet: "fresh", PeakRSSBytes: 150 << 20},
	}
	return r
}

// Ensure the per-kind sums add every replica's figures, per fleet, and a
// report from before kinds were recorded still sums by process name.
func TestKindSums(t *testing.T) {
	sums := replicatedResult().KindSums()
	want := []KindSum{
		{Fleet: "first", Kind: fleet.KindEnvironment, Processes: 2, PeakRSSBytes: 500 << 20, PeakFDs: 130, FDsAtBoundary: 22, StackBytesAtBoundary: 150 << 20, GoroutinesAtBoundary: 31000, CPUSeconds: 10},
		{Fleet: "first", Kind: fleet.KindAgent, Processes: 1, PeakRSSBytes: 100 << 20, FDsAtBoundary: 5},
		{Fleet: "kept", Kind: fleet.KindFakeInference, Processes: 1, PeakRSSBytes: 600 << 20},
		{Fleet: "fresh", Kind: fleet.KindEnvironment, Processes: 2, PeakRSSBytes: 400 << 20},
	}
	if !slices.Equal(sums, want) {
		t.Fatalf("sums\n%+v\nwant\n%+v", sums, want)
	}
	old := sampleResult() // no kinds recorded
	if k, ok := old.kindSum("first", fleet.KindEnvironment); !ok || k.PeakRSSBytes != 800<<20 {
		t.Fatalf("kind of an unrecorded env process: %+v %v", k, ok)
	}
	var buf bytes.Buffer
	if err := replicatedResult().WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"2 replica(s) of each kind", "environment, sum of 2 first 500.0 MiB 22 130 10.0 150.0 MiB, 31000 goroutines (9.6 KiB per rollout)", "env-1 first 200.0 MiB 12 60 4.0 50.0 MiB, 15000 goroutines"} {
		if !strings.Contains(squeeze(buf.String()), squeeze(want)) {
			t.Errorf("the table lacks %q:\n%s", want, buf.String())
		}
	}
}

// Ensure a one-replica and a two-replica run compare by kind, where their
// process names differ.
func TestWriteComparison_AcrossReplicaCounts(t *testing.T) {
	var out bytes.Buffer
	if err := WriteComparison(&out, []*Result{sampleResult(), replicatedResult()}); err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for _, line := range strings.Split(out.String(), "\n") {
		if name, cells, ok := strings.Cut(line, "  "); ok {
			rows[strings.TrimSpace(name)] = strings.Join(strings.Fields(cells), " ")
		}
	}
	for name, want := range map[string]string{
		"replicas of each kind":                       "1 2",
		"environment (first), sum of peak RSS":        "800.0 MiB 500.0 MiB",
		"environment (first), sum of fds at boundary": "19 22",
		"agent (first), sum of peak RSS":              "- 100.0 MiB",
	} {
		if got := rows[name]; got != want {
			t.Errorf("row %q = %q, want %q\n%s", name, got, want, out.String())
		}
	}
	if _, ok := rows["env (first), peak RSS"]; ok {
		t.Errorf("a process only one run has is listed by name:\n%s", out.String())
	}
}
