// Package replica is how a fleet with several replicas of a server kind
// routes a rollout and restores into a different number of replicas:
// replicas' instance names, the replica a new rollout goes to, and the
// placement of a checkpoint's former instances on live ones
// (docs/CHECKPOINTS.md, "Replicas"). It is pure: servers, gymctl and the
// coordinator share it, so every caller of a kind picks the same replica.
package replica

import (
	"fmt"
	"hash/fnv"
	"sort"
	"strconv"
	"strings"
)

// Name is the instance name of replica i of n replicas of base: base itself
// when there is one replica (so a fleet of single servers keeps its names
// and its checkpoints), else base-i.
func Name(base string, i, n int) string {
	if n <= 1 {
		return base
	}
	return base + "-" + strconv.Itoa(i)
}

// Names lists the instance names of n replicas of base.
func Names(base string, n int) []string {
	if n < 1 {
		n = 1
	}
	out := make([]string, n)
	for i := range out {
		out[i] = Name(base, i, n)
	}
	return out
}

// Family is the base name of an instance: the name without a trailing
// "-<digits>" replica suffix. Replicas of one server share it; a checkpoint's
// former instance is placed only on a live replica of its family.
func Family(instance string) string {
	i := strings.LastIndexByte(instance, '-')
	if i <= 0 || i == len(instance)-1 {
		return instance
	}
	if _, err := strconv.Atoi(instance[i+1:]); err != nil || strings.ContainsAny(instance[i+1:], "+-") {
		return instance
	}
	return instance[:i]
}

// Pick is the replica, of n, that a rollout's calls go to when nothing
// recorded says otherwise: a stable hash of the rollout id, not of the
// attempt, so a replacement attempt lands where its rollout's state is (a
// restore into another count puts the state there: Spread), and every
// caller (the client, the environment, the agent) computes the same replica
// on its own.
func Pick(rolloutID string, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(rolloutID))
	return int(h.Sum32() % uint32(n))
}

// Former is one instance a checkpoint holds records of, with how many.
type Former struct {
	Instance string
	Records  int
}

// Plan is where a restore installs each former instance's records.
type Plan struct {
	// Sources maps each live instance to the former instances whose
	// records it installs (its own name first when the checkpoint has it).
	Sources map[string][]string
	// Aliases maps each former instance that has no live replica of its
	// name to the live replica that took its records; routers send the
	// former owner's rollouts there.
	Aliases map[string]string
	// Partitions, for a family reached by rollout id (Spread), is each
	// live instance's share of the family's records; nil for one reached
	// by a recorded owner (Place).
	Partitions map[string]Partition
}

// Partition is a live replica's share of a family whose calls are routed by
// rollout id: replica Index of Count keeps the records of the rollouts Pick
// sends to it, which is where every caller now sends their calls.
type Partition struct {
	Index int `json:"index"`
	Count int `json:"count"`
}

// Keeps reports whether a rollout's records belong to this replica.
func (p Partition) Keeps(rolloutID string) bool { return Pick(rolloutID, p.Count) == p.Index }

// Of is the partition of instance among count replicas of family, false when
// instance is not one of Names(family, count). A lone replica keeps every
// rollout whatever its suffix (a StatefulSet's only pod is x-0): its callers
// have one replica to pick.
func Of(family, instance string, count int) (Partition, bool) {
	if count <= 1 {
		return Partition{Index: 0, Count: 1}, Family(instance) == family
	}
	for i, n := range Names(family, count) {
		if n == instance {
			return Partition{Index: i, Count: count}, true
		}
	}
	return Partition{}, false
}

// Place plans a restore of one family's former instances into its live
// ones, as the reference places sessions over worker counts (protocol.md
// §4.7): a former instance whose name is live stays there; every other one
// goes whole (all its records together) to the live replica holding the
// fewest records, then the fewest former owners, then the first by name.
// live must not be empty.
func Place(former []Former, live []string) (Plan, error) {
	if len(live) == 0 {
		return Plan{}, fmt.Errorf("no live replica to restore %d former instance(s) into", len(former))
	}
	p := Plan{Sources: map[string][]string{}, Aliases: map[string]string{}}
	records := map[string]int{}
	owners := map[string]int{}
	isLive := map[string]bool{}
	for _, l := range live {
		isLive[l] = true
		p.Sources[l] = []string{}
	}
	var orphans []Former
	for _, f := range former {
		if isLive[f.Instance] {
			p.Sources[f.Instance] = append(p.Sources[f.Instance], f.Instance)
			records[f.Instance] += f.Records
			owners[f.Instance]++
			continue
		}
		orphans = append(orphans, f)
	}
	// Largest first, so the balance by records is greedy-good; names break
	// ties so the plan is the same on every run.
	sort.Slice(orphans, func(i, j int) bool {
		if orphans[i].Records != orphans[j].Records {
			return orphans[i].Records > orphans[j].Records
		}
		return orphans[i].Instance < orphans[j].Instance
	})
	names := append([]string(nil), live...)
	sort.Strings(names)
	for _, f := range orphans {
		best := names[0]
		for _, l := range names[1:] {
			if records[l] < records[best] || (records[l] == records[best] && owners[l] < owners[best]) {
				best = l
			}
		}
		p.Sources[best] = append(p.Sources[best], f.Instance)
		p.Aliases[f.Instance] = best
		records[best] += f.Records
		owners[best]++
	}
	return p, nil
}

// Spread plans a restore of one family whose callers route by rollout id
// (Pick over the live replicas, in the order of Names) into its live
// replicas. No handle names an owner there, so nothing can be aliased:
// each record goes where its rollout's calls now go. Every live replica
// reads every former instance and keeps its Partition of the records, so
// a rollout's state lands on the replica Pick names for it with the live
// count, whatever the former count was. Several live replicas must be
// exactly the names Names(family, len(live)) (in any order): callers index
// replicas by position, and a set not named so has no position to route by.
func Spread(family string, former []Former, live []string) (Plan, error) {
	if len(live) == 0 {
		return Plan{}, fmt.Errorf("no live replica to restore %d former instance(s) into", len(former))
	}
	sources := make([]string, 0, len(former))
	for _, f := range former {
		sources = append(sources, f.Instance)
	}
	sort.Strings(sources)
	p := Plan{Sources: map[string][]string{}, Aliases: map[string]string{}, Partitions: map[string]Partition{}}
	for _, l := range live {
		part, ok := Of(family, l, len(live))
		if !ok {
			return Plan{}, fmt.Errorf("live replica %s is not one of %s: rollouts cannot be routed to it by position", l, strings.Join(Names(family, len(live)), ", "))
		}
		if _, dup := p.Partitions[l]; dup {
			return Plan{}, fmt.Errorf("live replica %s appears twice", l)
		}
		p.Sources[l] = append([]string(nil), sources...)
		p.Partitions[l] = part
	}
	return p, nil
}

// Resolve is the live instance that serves a recorded owner: the owner
// itself when live, else its alias when that is live, else "" (the caller
// then falls back to Pick). A restored record is rewritten to its resolved
// owner, so the next checkpoint names a live one and aliases never chain.
func Resolve(owner string, live func(string) bool, aliases map[string]string) string {
	if owner == "" || live(owner) {
		return owner
	}
	if a := aliases[owner]; a != "" && live(a) {
		return a
	}
	return ""
}
