package e2e

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/servers/environment"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// nemoRLRow is row as NeMo RL sends it (nemo_rl/experience/rollouts.py
// _prepare_nemo_gym_rows; async_utils/trajectory_collector.py
// _stamp_nemo_gym_task_indices, at NeMo RL 7ea279abfbeb): no rollout id,
// the sampling parameters in responses_create_params, and the given index
// fields (_rowidx, maybe _ng_task_index).
func nemoRLRow(row map[string]any, index map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range row {
		if k != rollout.FieldRolloutID {
			out[k] = v
		}
	}
	params := map[string]any{}
	for k, v := range row[rollout.FieldParams].(map[string]any) {
		params[k] = v
	}
	params["temperature"], params["top_p"], params["max_output_tokens"] = 1.0, 1.0, 4096
	out[rollout.FieldParams] = params
	for k, v := range index {
		out[k] = v
	}
	return out
}

// continued is the row a controller resends to continue a restored
// episode of a row that had no rollout id: the same row, naming the
// episode the environment gave it and the next attempt.
func continued(row map[string]any, id rollout.EpisodeID) map[string]any {
	out := map[string]any{}
	for k, v := range row {
		out[k] = v
	}
	out[rollout.FieldRolloutID] = id.RolloutID
	out[rollout.FieldAttemptIndex] = id.Attempt + 1
	return out
}

// Episodes lists the environment's episodes in flight (GET /episodes).
func (f *Fleet) Episodes() []environment.EpisodeListing {
	f.t.Helper()
	rep, err := httpclient.Do(context.Background(), f.ctl, http.MethodGet, f.EnvURL+"/episodes", nil, nil)
	if err != nil || !rep.OK() {
		f.t.Fatalf("GET /episodes: %v %v", err, rep)
	}
	var r environment.EpisodesReply
	if err := codec.Unmarshal(rep.Body, &r); err != nil {
		f.t.Fatal(err)
	}
	return r.Episodes
}

// Scenario 15: NeMo RL's rows, which name no rollout, and a NeMo Gym row
// named by its indices, in flight at a checkpoint. The controller learns the ids the environment gave them from
// GET /episodes (matching its rows by _rowidx and _ng_task_index), names
// them in the commit scope, and after every fleet process is killed and the
// checkpoint restored, resends each row with _ng_rollout_id and the next
// _ng_attempt_index (the Gym row: its own row with _ng_attempt_index "1").
// Each continues from its boundary to reward 1.0; the delivered first model
// call is never repeated.
func TestScenario15_UpstreamRowShapesContinueAfterCrash(t *testing.T) {
	t.Run("single_agent_turn", func(t *testing.T) { idLessRowsContinue(t, "weather_agent") })
	t.Run("legacy", func(t *testing.T) { idLessRowsContinue(t, "weather_agent_legacy") })
}

func idLessRowsContinue(t *testing.T, route string) {
	f := startFleet(t, nil)
	f.HoldSecondCalls()
	// A NeMo Gym row beside them names its rollout by its indices.
	gymRow := weatherRow("", route, "Lima")
	delete(gymRow, rollout.FieldRolloutID)
	gymRow[rollout.FieldTaskIndex], gymRow[rollout.FieldRolloutIndex] = 9, 0
	rows := []map[string]any{
		nemoRLRow(weatherRow("", route, "Paris"), map[string]any{"_rowidx": 0}),
		nemoRLRow(weatherRow("", route, "Oslo"), map[string]any{rollout.FieldTaskIndex: 5, "_rowidx": 1}),
		gymRow,
	}
	first := []*Run{f.Start(rows[0]), f.Start(rows[1]), f.Start(rows[2])}

	var listed []environment.EpisodeListing
	f.WaitFor("every row listed in flight", 60*time.Second, func() bool {
		listed = f.Episodes()
		return len(listed) == len(rows)
	})
	ids := make([]rollout.EpisodeID, len(rows))
	for _, e := range listed {
		switch {
		case e.Generated && string(e.RowIdx) == "0" && e.TaskIndex == nil:
			ids[0] = e.EpisodeID
		case e.Generated && string(e.RowIdx) == "1" && string(e.TaskIndex) == "5":
			ids[1] = e.EpisodeID
		case !e.Generated && e.EpisodeID == ep("9-0", 0) && string(e.RolloutIndex) == "0":
			ids[2] = e.EpisodeID
		default:
			t.Fatalf("unexpected listing %+v", e)
		}
	}
	for _, id := range ids {
		f.WaitHeld(id.RolloutID, 2)
	}

	f.Checkpoint(f.Coord(), "c1", ids...)
	f.CrashAndRestore("c1", ids...)
	for i, run := range first {
		if rep := run.Wait(t, 30*time.Second); rep.Status == http.StatusOK {
			t.Fatalf("row %d's first attempt replied across a crash: %v", i, rep.Body)
		}
	}
	f.Release()
	for i, row := range rows {
		next := continued(row, ids[i])
		if i == 2 {
			// Gym's own resend: the same row, the attempt as a string.
			next = withAttempt(row, 0)
			next[rollout.FieldAttemptIndex] = "1"
		}
		rep := f.RunOK(next)
		assertReward(t, rep, 1.0)
		epID, _ := rep.Body["episode_id"].(map[string]any)
		if epID["rollout_id"] != ids[i].RolloutID || epID["attempt"] != 1.0 {
			t.Fatalf("row %d: episode_id %v, want %s attempt 1", i, epID, ids[i].RolloutID)
		}
		if got, want := f.MessageCounts(ids[i].RolloutID), []int{2, 4, 4}; !slices.Equal(got, want) {
			t.Fatalf("row %d (%s): model calls (messages each) %v, want %v: the delivered call 0 is never repeated", i, ids[i].RolloutID, got, want)
		}
	}
	if n := len(f.Episodes()); n != 0 {
		t.Fatalf("%d episodes still listed after every reply", n)
	}
}
