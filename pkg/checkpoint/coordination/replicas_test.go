package coordination_test

import (
	"context"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/checkpoint/coordination"
	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/control"
	"github.com/gymfleet/gymfleet/pkg/wire/replica"
)

// checkpointOf writes an empty checkpoint of each kind/instance into dir.
func checkpointOf(t *testing.T, dir string, parts [][2]string) {
	t.Helper()
	for _, p := range parts {
		target := ckptstore.Target{Dir: dir, Kind: p[0], Instance: p[1], CheckpointID: "c1"}
		none := func(context.Context, ctlplane.Scope, func(ctlplane.Record) error) (ctlplane.Extras, error) {
			return ctlplane.Extras{}, nil
		}
		if _, err := ctlplanetest.WriteCheckpoint(context.Background(), target, ctlplane.Scope{}, none); err != nil {
			t.Fatal(err)
		}
	}
}

func members(parts [][2]string) []coordination.Member {
	var out []coordination.Member
	for _, p := range parts {
		out = append(out, coordination.Member{Name: p[1], Kind: p[0], Instance: p[1], URL: "http://127.0.0.1:1"})
	}
	return out
}

func TestPlanReplicas(t *testing.T) {
	former := [][2]string{{"environment", "env"}, {"model", "policy_model"}, {"agent", "a-0"}, {"agent", "a-1"}, {"agent", "b"}}
	for _, tc := range []struct {
		name    string
		live    [][2]string
		nilPlan bool
		code    apierror.Code
		check   func(t *testing.T, plan map[string][]string, aliases map[string]string)
	}{
		{name: "same replicas restore their own", live: former, nilPlan: true},
		{
			name: "two agents into three",
			live: [][2]string{{"environment", "env"}, {"model", "policy_model"}, {"agent", "a-0"}, {"agent", "a-1"}, {"agent", "a-2"}, {"agent", "b"}},
			check: func(t *testing.T, plan map[string][]string, aliases map[string]string) {
				if !slices.Equal(plan["a-2"], []string{}) || !slices.Equal(plan["a-0"], []string{"a-0"}) || !slices.Equal(plan["env"], []string{"env"}) || len(aliases) != 0 {
					t.Fatalf("plan %v aliases %v", plan, aliases)
				}
			},
		},
		{
			name: "two agents into one",
			live: [][2]string{{"environment", "env"}, {"model", "policy_model"}, {"agent", "a"}, {"agent", "b"}},
			check: func(t *testing.T, plan map[string][]string, aliases map[string]string) {
				if !slices.Equal(plan["a"], []string{"a-0", "a-1"}) || aliases["a-0"] != "a" || aliases["a-1"] != "a" {
					t.Fatalf("plan %v aliases %v", plan, aliases)
				}
			},
		},
		{
			name: "model servers not named as callers index them are refused",
			live: [][2]string{{"environment", "env"}, {"model", "policy_model-0"}, {"model", "policy_model-2"}, {"agent", "a-0"}, {"agent", "a-1"}, {"agent", "b"}},
			code: apierror.ReplicasUnsupported,
		},
		{
			name:    "a coordinator of part of the fleet leaves the kinds it has no member of",
			live:    [][2]string{{"environment", "env"}, {"model", "policy_model"}},
			nilPlan: true,
		},
		{
			name: "an agent with no live replica is refused",
			live: [][2]string{{"environment", "env"}, {"model", "policy_model"}, {"agent", "a-0"}, {"agent", "a-1"}},
			code: apierror.ReplicasUnsupported,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "c1")
			checkpointOf(t, dir, former)
			c := coordination.New(members(tc.live), coordination.Options{Token: token})
			plans, err := c.PlanReplicas(context.Background(), dir)
			if tc.code != "" {
				if !apierror.HasCode(err, tc.code) {
					t.Fatalf("err %v, want %s", err, tc.code)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.nilPlan {
				if plans != nil {
					t.Fatalf("plans %v, want none", plans)
				}
				return
			}
			sources := map[string][]string{}
			var aliases map[string]string
			for name, p := range plans {
				sources[name] = p.Sources
				aliases = p.Aliases
			}
			tc.check(t, sources, aliases)
		})
	}
}

// A legacy /run reaches its agent by rollout id, not through a recorded
// owner, so a checkpoint whose agents hold legacy episodes restores only
// into the same agent replicas; other families may still change.
func TestPlanReplicas_LegacyRunsRestoreOnlyIntoTheSameAgents(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "c1")
	checkpointOf(t, dir, [][2]string{{"environment", "env"}, {"model", "policy_model"}, {"agent", "a-0"}})
	legacy := func(context.Context, ctlplane.Scope, func(ctlplane.Record) error) (ctlplane.Extras, error) {
		return ctlplane.Extras{Manifest: map[string]any{control.ManifestLegacyRuns: 2}}, nil
	}
	target := ckptstore.Target{Dir: dir, Kind: "agent", Instance: "a-1", CheckpointID: "c1"}
	if _, err := ctlplanetest.WriteCheckpoint(context.Background(), target, ctlplane.Scope{}, legacy); err != nil {
		t.Fatal(err)
	}

	into := func(live [][2]string) (map[string]*control.ReplicaPlan, error) {
		return coordination.New(members(live), coordination.Options{Token: token}).PlanReplicas(context.Background(), dir)
	}
	_, err := into([][2]string{{"environment", "env"}, {"model", "policy_model"}, {"agent", "a-0"}, {"agent", "a-1"}, {"agent", "a-2"}})
	if !apierror.HasCode(err, apierror.ReplicasUnsupported) || !strings.Contains(err.Error(), "2 legacy /run episodes") {
		t.Fatalf("two agents holding legacy runs into three: %v, want replicas_unsupported naming them", err)
	}
	plans, err := into([][2]string{{"environment", "env"}, {"model", "policy_model"}, {"agent", "a-0"}, {"agent", "a-1"}})
	if err != nil || plans != nil {
		t.Fatalf("into the same agents: plans %v, err %v; want each restoring its own", plans, err)
	}
	plans, err = into([][2]string{{"environment", "env"}, {"model", "policy_model-0"}, {"model", "policy_model-1"}, {"agent", "a-0"}, {"agent", "a-1"}})
	if err != nil || plans == nil || !slices.Equal(plans["a-1"].Sources, []string{"a-1"}) {
		t.Fatalf("the same agents, two model servers: plans %v, err %v", plans, err)
	}
}

// The kinds reached by rollout id restore into any count: every live
// replica of a changed family reads all its former instances and keeps its
// partition; unchanged families restore their own, and nothing is aliased.
func TestPlanReplicas_RolloutRoutedKinds(t *testing.T) {
	former := [][2]string{
		{"environment", "env-0"}, {"environment", "env-1"},
		{"resources", "weather-0"}, {"resources", "weather-1"},
		{"model", "policy_model-0"}, {"model", "policy_model-1"},
		{"agent", "a-0"}, {"agent", "a-1"},
	}
	type want struct {
		sources   []string
		partition *replica.Partition
	}
	for _, tc := range []struct {
		name    string
		live    [][2]string
		want    map[string]want
		aliases map[string]string
	}{
		{
			name: "two of each into three",
			live: [][2]string{
				{"environment", "env-0"}, {"environment", "env-1"}, {"environment", "env-2"},
				{"resources", "weather-0"}, {"resources", "weather-1"}, {"resources", "weather-2"},
				{"model", "policy_model-0"}, {"model", "policy_model-1"}, {"model", "policy_model-2"},
				{"agent", "a-0"}, {"agent", "a-1"}, {"agent", "a-2"},
			},
			want: map[string]want{
				"env-0":          {[]string{"env-0", "env-1"}, &replica.Partition{Index: 0, Count: 3}},
				"env-2":          {[]string{"env-0", "env-1"}, &replica.Partition{Index: 2, Count: 3}},
				"weather-1":      {[]string{"weather-0", "weather-1"}, &replica.Partition{Index: 1, Count: 3}},
				"policy_model-2": {[]string{"policy_model-0", "policy_model-1"}, &replica.Partition{Index: 2, Count: 3}},
				"a-0":            {[]string{"a-0"}, nil},
				"a-2":            {[]string{}, nil},
			},
			aliases: map[string]string{},
		},
		{
			name: "two of each into one",
			live: [][2]string{{"environment", "env"}, {"resources", "weather"}, {"model", "policy_model"}, {"agent", "a"}},
			want: map[string]want{
				"env":          {[]string{"env-0", "env-1"}, &replica.Partition{Index: 0, Count: 1}},
				"weather":      {[]string{"weather-0", "weather-1"}, &replica.Partition{Index: 0, Count: 1}},
				"policy_model": {[]string{"policy_model-0", "policy_model-1"}, &replica.Partition{Index: 0, Count: 1}},
				"a":            {[]string{"a-0", "a-1"}, nil},
			},
			aliases: map[string]string{"a-0": "a", "a-1": "a"},
		},
		{
			name: "only the model count changes",
			live: [][2]string{
				{"environment", "env-0"}, {"environment", "env-1"}, {"resources", "weather-0"}, {"resources", "weather-1"},
				{"model", "policy_model"}, {"agent", "a-0"}, {"agent", "a-1"},
			},
			want: map[string]want{
				"env-1":        {[]string{"env-1"}, nil},
				"weather-0":    {[]string{"weather-0"}, nil},
				"policy_model": {[]string{"policy_model-0", "policy_model-1"}, &replica.Partition{Index: 0, Count: 1}},
				"a-1":          {[]string{"a-1"}, nil},
			},
			aliases: map[string]string{},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "c1")
			checkpointOf(t, dir, former)
			c := coordination.New(members(tc.live), coordination.Options{Token: token})
			plans, err := c.PlanReplicas(context.Background(), dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(plans) != len(tc.live) {
				t.Fatalf("%d plans for %d members", len(plans), len(tc.live))
			}
			for name, w := range tc.want {
				p := plans[name]
				if p == nil || !slices.Equal(p.Sources, w.sources) || !reflect.DeepEqual(p.Partition, w.partition) || !reflect.DeepEqual(p.Aliases, tc.aliases) {
					t.Errorf("plan of %s %+v, want sources %v partition %v aliases %v", name, p, w.sources, w.partition, tc.aliases)
				}
			}
		})
	}
}
