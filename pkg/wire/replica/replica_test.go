package replica_test

import (
	"fmt"
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

func TestSpread(t *testing.T) {
	for _, tc := range []struct {
		name       string
		former     []replica.Former
		live       []string
		sources    []string
		partitions map[string]replica.Partition
		fails      bool
	}{
		{
			name:       "two into three: every replica reads both and keeps its share",
			former:     []replica.Former{{"m-1", 2}, {"m-0", 3}},
			live:       []string{"m-0", "m-1", "m-2"},
			sources:    []string{"m-0", "m-1"},
			partitions: map[string]replica.Partition{"m-0": {0, 3}, "m-1": {1, 3}, "m-2": {2, 3}},
		},
		{
			name:       "two into one: the bare name keeps everything",
			former:     []replica.Former{{"m-0", 3}, {"m-1", 2}},
			live:       []string{"m"},
			sources:    []string{"m-0", "m-1"},
			partitions: map[string]replica.Partition{"m": {0, 1}},
		},
		{
			name:       "one into two, listed out of order",
			former:     []replica.Former{{"m", 4}},
			live:       []string{"m-1", "m-0"},
			sources:    []string{"m"},
			partitions: map[string]replica.Partition{"m-0": {0, 2}, "m-1": {1, 2}},
		},
		{
			name:       "two into a lone replica with a suffix, as a StatefulSet names it",
			former:     []replica.Former{{"m-0", 3}, {"m-1", 2}},
			live:       []string{"m-0"},
			sources:    []string{"m-0", "m-1"},
			partitions: map[string]replica.Partition{"m-0": {0, 1}},
		},
		{name: "a lone replica of another family", former: []replica.Former{{"m-0", 1}}, live: []string{"n-0"}, fails: true},
		{name: "a live set with a gap has no positions", former: []replica.Former{{"m-0", 1}}, live: []string{"m-0", "m-2"}, fails: true},
		{name: "a bare name among several", former: []replica.Former{{"m-0", 1}}, live: []string{"m", "m-1"}, fails: true},
		{name: "no live replica", former: []replica.Former{{"m-0", 1}}, fails: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := replica.Spread("m", tc.former, tc.live)
			if tc.fails {
				if err == nil {
					t.Fatalf("plan %+v, want an error", p)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range tc.live {
				if !reflect.DeepEqual(p.Sources[l], tc.sources) {
					t.Errorf("sources of %s = %v, want %v", l, p.Sources[l], tc.sources)
				}
			}
			if !reflect.DeepEqual(p.Partitions, tc.partitions) || len(p.Aliases) != 0 {
				t.Errorf("partitions %v aliases %v, want %v and none", p.Partitions, p.Aliases, tc.partitions)
			}
		})
	}
}

// Every rollout is kept by exactly the replica Pick sends it to, so a
// restore by partitions leaves each rollout's state where its calls go.
func TestPartitionKeepsWhatPickRoutes(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5} {
		for i := range 50 {
			id := fmt.Sprintf("r%d", i)
			keepers := 0
			for j, name := range replica.Names("x", n) {
				part, ok := replica.Of("x", name, n)
				if !ok || part.Index != j {
					t.Fatalf("Of(x, %s, %d) = %v %v", name, n, part, ok)
				}
				if part.Keeps(id) {
					keepers++
					if j != replica.Pick(id, n) {
						t.Fatalf("%s kept by replica %d of %d, Pick says %d", id, j, n, replica.Pick(id, n))
					}
				}
			}
			if keepers != 1 {
				t.Fatalf("%s kept by %d of %d replicas, want 1", id, keepers, n)
			}
		}
	}
	if _, ok := replica.Of("x", "x-3", 3); ok {
		t.Error("x-3 is not one of three replicas of x")
	}
}
