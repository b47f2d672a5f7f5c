package replica_test

import (
	"reflect"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/wire/replica"
)

func TestNamesAndFamily(t *testing.T) {
	if got := replica.Names("agent", 1); !reflect.DeepEqual(got, []string{"agent"}) {
		t.Errorf("one replica: %v", got)
	}
	if got := replica.Names("agent", 3); !reflect.DeepEqual(got, []string{"agent-0", "agent-1", "agent-2"}) {
		t.Errorf("three replicas: %v", got)
	}
	for in, want := range map[string]string{
		"weather_agent-1": "weather_agent", "weather_agent": "weather_agent", "env-12": "env",
		"a-b": "a-b", "x-": "x-", "-3": "-3", "m-+1": "m-+1",
	} {
		if got := replica.Family(in); got != want {
			t.Errorf("Family(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPickIsStableAndSpreads(t *testing.T) {
	seen := map[int]int{}
	for _, id := range []string{"r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9"} {
		i := replica.Pick(id, 2)
		if i != replica.Pick(id, 2) || i < 0 || i > 1 {
			t.Fatalf("Pick(%q, 2) = %d, not stable or out of range", id, i)
		}
		seen[i]++
	}
	if len(seen) != 2 {
		t.Errorf("ten rollouts all went to one of two replicas: %v", seen)
	}
	if replica.Pick("anything", 1) != 0 || replica.Pick("anything", 0) != 0 {
		t.Error("one replica must always be picked")
	}
}

func TestPlace(t *testing.T) {
	for _, tc := range []struct {
		name    string
		former  []replica.Former
		live    []string
		sources map[string][]string
		aliases map[string]string
	}{
		{
			name:    "same replicas stay",
			former:  []replica.Former{{"a-0", 3}, {"a-1", 2}},
			live:    []string{"a-0", "a-1"},
			sources: map[string][]string{"a-0": {"a-0"}, "a-1": {"a-1"}},
			aliases: map[string]string{},
		},
		{
			name:    "two into three: the new replica installs nothing",
			former:  []replica.Former{{"a-0", 3}, {"a-1", 2}},
			live:    []string{"a-0", "a-1", "a-2"},
			sources: map[string][]string{"a-0": {"a-0"}, "a-1": {"a-1"}, "a-2": {}},
			aliases: map[string]string{},
		},
		{
			name:    "three into two: the orphan goes to the fewest records",
			former:  []replica.Former{{"a-0", 5}, {"a-1", 1}, {"a-2", 4}},
			live:    []string{"a-0", "a-1"},
			sources: map[string][]string{"a-0": {"a-0"}, "a-1": {"a-1", "a-2"}},
			aliases: map[string]string{"a-2": "a-1"},
		},
		{
			name:    "one into two: the bare name goes whole to one replica",
			former:  []replica.Former{{"a", 7}},
			live:    []string{"a-0", "a-1"},
			sources: map[string][]string{"a-0": {"a"}, "a-1": {}},
			aliases: map[string]string{"a": "a-0"},
		},
		{
			name:    "ties in records go to the fewest owners, then by name",
			former:  []replica.Former{{"a-2", 0}, {"a-3", 0}, {"a-4", 0}},
			live:    []string{"a-1", "a-0"},
			sources: map[string][]string{"a-0": {"a-2", "a-4"}, "a-1": {"a-3"}},
			aliases: map[string]string{"a-2": "a-0", "a-3": "a-1", "a-4": "a-0"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := replica.Place(tc.former, tc.live)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(p.Sources, tc.sources) {
				t.Errorf("sources = %v, want %v", p.Sources, tc.sources)
			}
			if !reflect.DeepEqual(p.Aliases, tc.aliases) {
				t.Errorf("aliases = %v, want %v", p.Aliases, tc.aliases)
			}
		})
	}
	if _, err := replica.Place([]replica.Former{{"a", 1}}, nil); err == nil {
		t.Error("placing into no replica must fail")
	}
}

func TestResolve(t *testing.T) {
	live := func(s string) bool { return s == "a-0" || s == "a-1" }
	aliases := map[string]string{"a-2": "a-1", "a-3": "a-9"}
	for owner, want := range map[string]string{"a-0": "a-0", "a-2": "a-1", "a-3": "", "a-7": "", "": ""} {
		if got := replica.Resolve(owner, live, aliases); got != want {
			t.Errorf("Resolve(%q) = %q, want %q", owner, got, want)
		}
	}
}
