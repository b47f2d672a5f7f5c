package collect

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// Summary describes a collection run.
type Summary struct {
	// Rows is the number of rows to run (after skipping and the limit).
	Rows int `json:"rows"`
	// Succeeded rows went to the output, Failed ones to the failures file.
	Succeeded int `json:"succeeded"`
	Failed    int `json:"failed"`
	// Interrupted rows were in flight when the run was stopped; NotStarted
	// were never sent. Neither is written anywhere.
	Interrupted int `json:"interrupted"`
	NotStarted  int `json:"not_started"`
	// Skipped are input lines that were not run.
	Skipped      []LineIssue `json:"skipped,omitempty"`
	FailuresFile string      `json:"failures_file,omitempty"`
	// FailureCodes counts failures by error code.
	FailureCodes map[string]int `json:"failure_codes,omitempty"`
	// Rewards are over succeeded rows that carry a numeric reward.
	Rewards RewardStats `json:"rewards"`
	// ModelCalls sums observations.model_calls over the rows that report it.
	ModelCalls         int `json:"model_calls"`
	RowsWithModelCalls int `json:"rows_with_model_calls"`
	// Wall is the run's wall time.
	Wall time.Duration `json:"wall_ns"`
	// Tasks break the run down by agent (agent_ref.name; "-" for none).
	Tasks []TaskStats `json:"tasks"`

	// RunID is the run's dispatch log id (checkpointed runs only).
	RunID string `json:"run_id,omitempty"`
	// AlreadyFinished are input rows a resumed run found in the output.
	AlreadyFinished int `json:"already_finished"`
	// Continued rows were restored from a checkpoint and sent as their next
	// attempt; Restarted rows were started over as a later attempt (sent by
	// a crashed run and not continued, or sent without a reply).
	Continued int `json:"continued"`
	Restarted int `json:"restarted"`
	// Retired counts attempts retired everywhere, Forgotten rollouts whose
	// retired attempts were forgotten at the end.
	Retired   int `json:"retired"`
	Forgotten int `json:"forgotten"`
	// Restore is the resumed run's restore, if it restored.
	Restore *RestoreStats `json:"restore,omitempty"`
	// Checkpoints are every checkpoint this run took or tried.
	Checkpoints []CheckpointStats `json:"checkpoints,omitempty"`
}

// PublishedCheckpoints counts the checkpoints that were published.
func (s *Summary) PublishedCheckpoints() int {
	n := 0
	for _, c := range s.Checkpoints {
		if c.Published {
			n++
		}
	}
	return n
}

// RewardStats summarise rewards.
type RewardStats struct {
	Count        int           `json:"count"`
	Mean         float64       `json:"mean"`
	Distribution []RewardCount `json:"distribution"`
}

// RewardCount is how many rows got one reward value.
type RewardCount struct {
	Reward float64 `json:"reward"`
	Count  int     `json:"count"`
}

// TaskStats are one task's (agent's) figures.
type TaskStats struct {
	Task               string        `json:"task"`
	Rows               int           `json:"rows"`
	Failed             int           `json:"failed"`
	MeanReward         float64       `json:"mean_reward"`
	RewardCount        int           `json:"reward_count"`
	ModelCalls         int           `json:"model_calls"`
	RowsWithModelCalls int           `json:"rows_with_model_calls"`
	LatencyP50         time.Duration `json:"latency_p50_ns"`
	LatencyP95         time.Duration `json:"latency_p95_ns"`
	// Throughput is finished rows per second, from the run's start to the
	// task's last finished row.
	Throughput float64 `json:"throughput"`
}

// RolloutsPerSecond is the finished rows over the wall time.
func (s *Summary) RolloutsPerSecond() float64 {
	if s.Wall <= 0 {
		return 0
	}
	return float64(s.Succeeded+s.Failed) / s.Wall.Seconds()
}

// AllRewardsOne reports whether every row ran, succeeded and got reward 1.0.
func (s *Summary) AllRewardsOne() bool {
	if s.Failed+s.Interrupted+s.NotStarted > 0 || s.Rewards.Count != s.Succeeded || s.Succeeded != s.Rows {
		return false
	}
	for _, rc := range s.Rewards.Distribution {
		if rc.Reward != 1 {
			return false
		}
	}
	return true
}

// WriteText writes the end-of-run summary.
func (s *Summary) WriteText(w io.Writer) {
	fmt.Fprintf(w, "rows: %d  succeeded: %d  failed: %d", s.Rows, s.Succeeded, s.Failed)
	if s.Interrupted+s.NotStarted > 0 {
		fmt.Fprintf(w, "  interrupted: %d  not started: %d", s.Interrupted, s.NotStarted)
	}
	if len(s.Skipped) > 0 {
		fmt.Fprintf(w, "  skipped lines: %d", len(s.Skipped))
	}
	fmt.Fprintln(w)
	if s.Rewards.Count > 0 {
		parts := make([]string, len(s.Rewards.Distribution))
		for i, rc := range s.Rewards.Distribution {
			parts[i] = fmt.Sprintf("%s×%d", formatReward(rc.Reward), rc.Count)
		}
		fmt.Fprintf(w, "reward: mean %.4f over %d rows  distribution: %s\n", s.Rewards.Mean, s.Rewards.Count, strings.Join(parts, "  "))
	}
	if s.RowsWithModelCalls > 0 {
		fmt.Fprintf(w, "model calls: %d (%.2f per rollout)\n", s.ModelCalls, float64(s.ModelCalls)/float64(s.RowsWithModelCalls))
	}
	fmt.Fprintf(w, "wall time: %s  rollouts/s: %.2f\n", s.Wall.Round(time.Millisecond), s.RolloutsPerSecond())
	if len(s.FailureCodes) > 0 {
		codes := make([]string, 0, len(s.FailureCodes))
		for c, n := range s.FailureCodes {
			codes = append(codes, fmt.Sprintf("%s×%d", c, n))
		}
		sort.Strings(codes)
		fmt.Fprintf(w, "failures: %s", strings.Join(codes, "  "))
		if s.FailuresFile != "" {
			fmt.Fprintf(w, " (rows in %s)", s.FailuresFile)
		}
		fmt.Fprintln(w)
	}
	for _, issue := range s.Skipped {
		fmt.Fprintf(w, "skipped %s\n", issue)
	}
	if s.AlreadyFinished+s.Continued+s.Restarted > 0 || s.Restore != nil {
		fmt.Fprintf(w, "resumed: %d rows already in the output, continued %d, restarted %d", s.AlreadyFinished, s.Continued, s.Restarted)
		if rs := s.Restore; rs != nil {
			if rs.Restored {
				fmt.Fprintf(w, " (restore of %s: %.3fs)", rs.CheckpointID, rs.Duration.Seconds())
			} else {
				fmt.Fprintf(w, " (restore of %s failed: %s)", rs.CheckpointID, rs.Error)
			}
		}
		fmt.Fprintln(w)
	}
	if s.Retired+s.Forgotten > 0 {
		fmt.Fprintf(w, "retired attempts: %d  forgotten rollouts: %d\n", s.Retired, s.Forgotten)
	}
	if len(s.Checkpoints) > 0 {
		fmt.Fprintf(w, "checkpoints: %d published of %d\n", s.PublishedCheckpoints(), len(s.Checkpoints))
		for _, c := range s.Checkpoints {
			state := "published"
			if !c.Published {
				state = "not taken: " + c.Error
			}
			fmt.Fprintf(w, "  %s  in flight %d  continued %d  restarted %d  prepare %.3fs%s  commit %.3fs  total %.3fs  %s\n",
				orDash(c.ID), c.InFlight, len(c.Continued), len(c.Restarted), c.Prepare.Seconds(), formatStages(c.PrepareStages), c.Commit.Seconds(), c.Total.Seconds(), state)
		}
	}
}

// formatStages is " (environment 0.010s, model 0.020s, ...)".
func formatStages(stages []StageTiming) string {
	if len(stages) == 0 {
		return ""
	}
	parts := make([]string, len(stages))
	for i, st := range stages {
		parts[i] = fmt.Sprintf("%s %.3fs", st.Kind, st.Duration.Seconds())
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// WriteTable writes the per-task table: rows, mean reward, model calls,
// p50/p95 rollout latency and throughput.
func (s *Summary) WriteTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "task\trows\tfailed\tmean reward\tmodel calls\tp50 latency\tp95 latency\trollouts/s\t")
	for _, t := range s.Tasks {
		reward, calls := "-", "-"
		if t.RewardCount > 0 {
			reward = fmt.Sprintf("%.3f", t.MeanReward)
		}
		if t.RowsWithModelCalls > 0 {
			calls = strconv.Itoa(t.ModelCalls)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%.1f\t\n", t.Task, t.Rows, t.Failed, reward, calls,
			t.LatencyP50.Round(time.Millisecond), t.LatencyP95.Round(time.Millisecond), t.Throughput)
	}
	_ = tw.Flush()
}

func formatReward(r float64) string { return strconv.FormatFloat(r, 'g', 6, 64) }

// stats accumulates results; the caller serialises access.
type stats struct {
	start        time.Time
	runID        string
	rows         int
	continued    int
	restartedSet map[string]bool
	retired      int
	forgotten    int
	succeeded    int
	failed       int
	interrupted  int
	codes        map[string]int
	rewardSum    float64
	rewards      map[float64]int
	modelCalls   int
	withCalls    int
	tasks        map[string]*taskAcc
	order        []string
}

type taskAcc struct {
	rows, failed, rewardN, calls, withCalls int
	rewardSum                               float64
	latencies                               []time.Duration
	last                                    time.Time
}

func newStats(rows int) *stats {
	return &stats{start: time.Now(), rows: rows, restartedSet: map[string]bool{}, codes: map[string]int{}, rewards: map[float64]int{}, tasks: map[string]*taskAcc{}}
}

func (st *stats) add(row *Row, res result) {
	name := row.Agent
	if name == "" {
		name = "-"
	}
	t := st.tasks[name]
	if t == nil {
		t = &taskAcc{}
		st.tasks[name] = t
		st.order = append(st.order, name)
	}
	t.rows++
	t.latencies = append(t.latencies, res.latency)
	t.last = res.finished
	if res.err != nil {
		st.failed++
		t.failed++
		st.codes[string(res.err.Code)]++
		return
	}
	st.succeeded++
	if r, ok := numberField(res.reply["reward"]); ok {
		st.rewardSum += r
		st.rewards[r]++
		t.rewardSum += r
		t.rewardN++
	}
	if n, ok := modelCalls(res.reply); ok {
		st.modelCalls += n
		st.withCalls++
		t.calls += n
		t.withCalls++
	}
}

func (st *stats) summary() *Summary {
	s := &Summary{
		Rows:               st.rows,
		Succeeded:          st.succeeded,
		Failed:             st.failed,
		Interrupted:        st.interrupted,
		NotStarted:         st.rows - st.succeeded - st.failed - st.interrupted,
		ModelCalls:         st.modelCalls,
		RowsWithModelCalls: st.withCalls,
		Wall:               time.Since(st.start),
	}
	if len(st.codes) > 0 {
		s.FailureCodes = st.codes
	}
	for r, n := range st.rewards {
		s.Rewards.Count += n
		s.Rewards.Distribution = append(s.Rewards.Distribution, RewardCount{Reward: r, Count: n})
	}
	sort.Slice(s.Rewards.Distribution, func(i, j int) bool { return s.Rewards.Distribution[i].Reward < s.Rewards.Distribution[j].Reward })
	if s.Rewards.Count > 0 {
		s.Rewards.Mean = st.rewardSum / float64(s.Rewards.Count)
	}
	names := append([]string(nil), st.order...)
	sort.Strings(names)
	for _, name := range names {
		t := st.tasks[name]
		ts := TaskStats{Task: name, Rows: t.rows, Failed: t.failed, RewardCount: t.rewardN, ModelCalls: t.calls, RowsWithModelCalls: t.withCalls}
		if t.rewardN > 0 {
			ts.MeanReward = t.rewardSum / float64(t.rewardN)
		}
		ts.LatencyP50, ts.LatencyP95 = percentile(t.latencies, 0.50), percentile(t.latencies, 0.95)
		if span := t.last.Sub(st.start); span > 0 {
			ts.Throughput = float64(t.rows) / span.Seconds()
		}
		s.Tasks = append(s.Tasks, ts)
	}
	return s
}

// percentile is the nearest-rank percentile of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sorted := append([]time.Duration(nil), ds...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	rank := int(math.Ceil(p*float64(len(sorted)))) - 1
	if rank < 0 {
		rank = 0
	}
	return sorted[rank]
}

func numberField(raw codec.RawMessage) (float64, bool) {
	if raw == nil {
		return 0, false
	}
	var f float64
	if err := codec.Unmarshal(raw, &f); err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}

// modelCalls reads observations.model_calls from a reply.
func modelCalls(reply map[string]codec.RawMessage) (int, bool) {
	raw, ok := reply["observations"]
	if !ok {
		return 0, false
	}
	var obs struct {
		ModelCalls *int `json:"model_calls"`
	}
	if err := codec.Unmarshal(raw, &obs); err != nil || obs.ModelCalls == nil {
		return 0, false
	}
	return *obs.ModelCalls, true
}
