package agent

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// An export lists its sessions in the scope's order, an episode's several
// sessions by session id, whatever order the session map gave them in.
func TestInScopeOrder_PlacesSessionsByScopePositionThenSessionID(t *testing.T) {
	var ids []rollout.EpisodeID
	for i := range 500 {
		ids = append(ids, rollout.EpisodeID{RolloutID: fmt.Sprintf("r%d", i), Attempt: i % 3})
	}
	scope := ctlplane.NewScope(ids)
	var want []exportedSession
	for i, id := range scope.IDs() {
		// Every seventh episode is left out; every fifth has three sessions.
		sessions := 1
		switch {
		case i%7 == 0:
			sessions = 0
		case i%5 == 0:
			sessions = 3
		}
		for s := range sessions {
			want = append(want, exportedSession{rec: sessionRecord{EpisodeID: id, SessionID: fmt.Sprintf("s-%d-%d", i, s)}})
		}
	}
	for seed := range uint64(20) {
		out := slices.Clone(want)
		rand.New(rand.NewPCG(seed, 1)).Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
		at := make([]int32, len(out))
		for k, e := range out {
			i, ok := scope.Index(e.rec.EpisodeID)
			if !ok {
				t.Fatalf("%v is not in the scope", e.rec.EpisodeID)
			}
			at[k] = int32(i)
		}
		inScopeOrder(out, at, scope.Len())
		for k := range want {
			if out[k].rec.SessionID != want[k].rec.SessionID || out[k].rec.EpisodeID != want[k].rec.EpisodeID {
				t.Fatalf("seed %d: position %d holds %v %s, want %v %s", seed, k,
					out[k].rec.EpisodeID, out[k].rec.SessionID, want[k].rec.EpisodeID, want[k].rec.SessionID)
			}
			if i, _ := scope.Index(out[k].rec.EpisodeID); at[k] != int32(i) {
				t.Fatalf("seed %d: at[%d] = %d was not moved with its session (%d)", seed, k, at[k], i)
			}
		}
	}
	inScopeOrder(nil, nil, 0)
}
