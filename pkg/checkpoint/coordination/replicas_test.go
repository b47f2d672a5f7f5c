package coordination_test

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/checkpoint/coordination"
	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
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
			name: "a model server count change is refused",
			live: [][2]string{{"environment", "env"}, {"model", "policy_model-0"}, {"model", "policy_model-1"}, {"agent", "a-0"}, {"agent", "a-1"}, {"agent", "b"}},
			code: apierror.ReplicasUnsupported,
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
