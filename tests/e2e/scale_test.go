package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ops/scalebench"
)

// The scale bench (issue 6) at 1,000 rollouts, as a correctness check of
// the controller contract, not a timing: every rollout held at its second
// model call is exported, none replies while the fleet is prepared or
// across the crash, and every replacement finishes with reward 1.0. It runs
// profiled, which checks every server's pprof routes too.
func TestScaleBench_1000RolloutsCheckpointedCrashedAndRestored(t *testing.T) {
	const n = 1000
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	// Profiling on: every server serves /debug/pprof/ (the pprof key) and
	// the bench collects its profiles, short ones.
	res, err := scalebench.Run(ctx, scalebench.Options{Rollouts: n, BinDir: binDir, Dir: t.TempDir(), Log: &progress, Profile: true, ProfileSeconds: 1})
	if res != nil {
		var table bytes.Buffer
		_ = res.WriteTable(&table)
		t.Logf("\n%s", table.String())
	}
	if err != nil {
		t.Fatalf("scale bench: %v\n--- progress ---\n%s", err, progress.String())
	}

	if res.InFlight != n {
		t.Errorf("%d rollouts held at the checkpoint, want %d", res.InFlight, n)
	}
	if !res.Prepare.Prepared {
		t.Errorf("prepare did not prepare every stage: %+v", res.Prepare.Stages)
	}
	var kinds []string
	for _, s := range res.Prepare.Stages {
		kinds = append(kinds, s.Kind)
		if s.Servers != 1 || len(s.Blockers) > 0 {
			t.Errorf("prepare stage %s: %d servers, blockers %v; want 1 server prepared", s.Kind, s.Servers, s.Blockers)
		}
	}
	if got, want := kinds, []string{"environment", "model", "agent", "resources"}; !slices.Equal(got, want) {
		t.Errorf("prepare stages %v, want %v", got, want)
	}
	if res.Exported != n || res.Restored != n {
		t.Errorf("exported %d and restored %d rollouts, want %d each", res.Exported, res.Restored, n)
	}
	// Every kind exports one record per rollout: the episode, its ledger,
	// its agent session and its resources session.
	for _, k := range res.Commit.Kinds {
		if k.Records != n || k.Exported != n || k.Bytes <= 0 {
			t.Errorf("commit of %s: %d records (%d bytes), %d exported; want %d records and %d exported", k.Kind, k.Records, k.Bytes, k.Exported, n, n)
		}
	}
	if len(res.Commit.Kinds) != 4 {
		t.Errorf("commit covered %d kinds, want 4: %+v", len(res.Commit.Kinds), res.Commit.Kinds)
	}
	if res.OriginalsReplied != 0 || res.OriginalsCutOff != n {
		t.Errorf("originals: %d replied, %d cut off; want 0 and %d", res.OriginalsReplied, res.OriginalsCutOff, n)
	}
	if res.Replacements != n || res.ReplacementFailures != 0 || res.RewardsNotOne != 0 {
		t.Errorf("replacements: %d sent, %d failed, %d rewards != 1.0; want %d, 0, 0", res.Replacements, res.ReplacementFailures, res.RewardsNotOne, n)
	}
	if len(res.Violations) != 0 {
		t.Errorf("contract violations: %v", res.Violations)
	}
	// The fresh fleet was read after the replacements and held no session.
	if ss := res.Sessions; ss.Seconds <= 0 || ss.ResourcesOpen != 0 || ss.AgentOpen != 0 || ss.RetriesPending != 0 || ss.RetriesAbandoned != 0 {
		t.Errorf("sessions after the replacements: %+v; want them read, none open, no cleanup step pending or abandoned", ss)
	}
	// A CPU profile of every server (and the bench) per profiled phase, and
	// a heap profile of every server of each fleet.
	var missing []string
	for _, proc := range []string{"fakeinference", "policy_model", "resources", "agents", "env"} {
		names := []string{"heap-first-" + proc, "heap-fresh-" + proc}
		for _, phase := range []string{"dispatch", "prepare", "commit", "restore"} {
			names = append(names, "cpu-"+phase+"-"+proc)
		}
		for _, name := range names {
			if st, err := os.Stat(filepath.Join(res.ProfilesDir, name+".pb.gz")); err != nil || st.Size() == 0 {
				missing = append(missing, name)
			}
		}
	}
	if len(missing) > 0 {
		t.Errorf("profiles missing or empty in %q: %v\n--- progress ---\n%s", res.ProfilesDir, missing, progress.String())
	}
	// Every timed phase counts each server's collections, read from its
	// /metrics at both edges.
	for _, pc := range res.PhaseCPU {
		for _, proc := range []string{"fakeinference", "policy_model", "resources", "agents", "env"} {
			if n, ok := pc.GCCycles[proc]; !ok || n < 0 {
				t.Errorf("%s: collections of %s %d (read: %v), want a count", pc.Phase, proc, n, ok)
			}
		}
	}
	// A fresh process starts with a heap goal of a few MiB, so taking in
	// the restore's body and reading 1,000 rollouts' records makes some
	// server collect (the hold on collections starts once the records are
	// read): a count read at the wrong edge (or not subtracted) would show
	// none.
	for _, pc := range res.PhaseCPU {
		if pc.Phase != "restore" {
			continue
		}
		var collected int64
		for _, n := range pc.GCCycles {
			collected += n
		}
		if collected == 0 {
			t.Errorf("restore: no server completed a collection by the counts %v; fresh processes growing to hold 1,000 rollouts do", pc.GCCycles)
		}
	}
	var phases []string
	for _, pc := range res.PhaseCPU {
		phases = append(phases, pc.Phase)
	}
	if strings.Join(phases, ",") != "dispatch,prepare,commit,restore" {
		t.Errorf("CPU figures for phases %v, want dispatch, prepare, commit and restore", phases)
	}
	// The disk's floor: the committed records files' bytes, written and
	// synced in the same run.
	if f := res.DiskFloor; f == nil || f.Seconds <= 0 || f.Files != len(res.Commit.Kinds) || f.Bytes <= 0 {
		t.Errorf("disk floor %+v, want %d files measured", f, len(res.Commit.Kinds))
	}
	seen := map[string]int{}
	for _, p := range res.Processes {
		seen[p.Fleet]++
		if p.PeakRSSBytes == 0 || p.Error != "" {
			t.Errorf("process %s (%s fleet): peak RSS %d, error %q", p.Name, p.Fleet, p.PeakRSSBytes, p.Error)
		}
	}
	if seen["first"] != 4 || seen["fresh"] != 4 || seen["kept"] != 1 {
		t.Errorf("process figures per fleet %v, want 4 first, 4 fresh, 1 kept (fakeinference)", seen)
	}
}
