package collect

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// ResumeState is what a resumed collection finds: the input rows, the
// rollouts already in the output, the previous run's dispatch log and the
// checkpoint LATEST names.
type ResumeState struct {
	Rows []Row
	// Finished are rollout ids with a row in the output.
	Finished map[string]bool
	// Log is the previous run's dispatch log (nil: none).
	Log *DispatchLog
	// Latest is the checkpoint LATEST names (nil: none, or unusable).
	Latest *CollectionManifest
}

// ResumePlan is what a resumed collection does before sending anything.
type ResumePlan struct {
	// CheckpointID is the checkpoint to restore ("" when Restore is empty).
	CheckpointID string
	// Restore is the scope of the restore: the attempts Latest continued
	// whose rows are unfinished. Each is sent as attempt + 1.
	Restore []rollout.EpisodeID
	// Retire are the attempts the previous run logged for unfinished rows
	// it does not continue: they are fenced everywhere before their rows
	// start over one attempt later.
	Retire []rollout.EpisodeID
	// Next is the attempt each unfinished row is sent as.
	Next map[string]int
	// Carry are the first entries of the new dispatch log: the fenced
	// attempts and the attempts the restore installs, so a crash of the new
	// run before it sends them still starts those rows over.
	Carry map[string]int
	// Finished counts input rows already in the output.
	Finished int
	// LatestIgnored says why Latest was not restored from ("" if it was, or
	// there was none).
	LatestIgnored string
}

// PlanResume decides, from what a previous run left, which rows continue
// from LATEST and which start over. It is pure: no I/O, no clock.
//
//   - Rows in the output are finished and never sent again.
//   - If LATEST belongs to the previous run (its run_id is the previous
//     dispatch log's), its continued attempts whose rows are unfinished
//     (and whose logged attempt is the continued one) are restored and sent
//     as attempt + 1.
//   - Every other unfinished row the previous run logged has its logged
//     attempt retired and starts over as max(its own attempt, logged + 1).
//   - Rows never logged start at their own attempt.
func PlanResume(s ResumeState) ResumePlan {
	p := ResumePlan{Next: map[string]int{}, Carry: map[string]int{}}
	logged := map[string]int{}
	prevRun := ""
	if s.Log != nil {
		logged, prevRun = s.Log.Attempts, s.Log.RunID
	}
	continued := map[string]int{}
	if s.Latest != nil {
		switch {
		case prevRun == "":
			p.LatestIgnored = fmt.Sprintf("there is no previous dispatch log to match checkpoint %s (run %s)", s.Latest.CheckpointID, s.Latest.RunID)
		case s.Latest.RunID != prevRun:
			p.LatestIgnored = fmt.Sprintf("checkpoint %s belongs to run %s, not to the previous run %s", s.Latest.CheckpointID, s.Latest.RunID, prevRun)
		default:
			for _, e := range s.Latest.Continued {
				continued[e.RolloutID] = e.Attempt
			}
		}
	}
	for _, row := range s.Rows {
		id, own := row.Episode.RolloutID, row.Episode.Attempt
		if s.Finished[id] {
			p.Finished++
			continue
		}
		last, wasLogged := logged[id]
		if a, ok := continued[id]; ok && (!wasLogged || last == a) && own <= a+1 {
			p.Restore = append(p.Restore, rollout.EpisodeID{RolloutID: id, Attempt: a})
			p.Next[id] = a + 1
			p.Carry[id] = a + 1
			continue
		}
		if a, ok := continued[id]; ok && (!wasLogged || a > last) {
			// Continued but not restorable (the input now names a later
			// attempt): fence the continued attempt too.
			last, wasLogged = a, true
		}
		if wasLogged {
			p.Retire = append(p.Retire, rollout.EpisodeID{RolloutID: id, Attempt: last})
			p.Carry[id] = last
			p.Next[id] = max(own, last+1)
			continue
		}
		p.Next[id] = own
	}
	if len(p.Restore) > 0 {
		p.CheckpointID = s.Latest.CheckpointID
	}
	return p
}

// RestoreFailed turns a plan whose restore failed into one that starts
// those rows over as attempt + 2: coordination.Restore retires every
// attempt + 1 (it may have installed them), but that retire is refused
// where a checkpoint is still open, so both the continued attempt and
// attempt + 1 are retired again once the fleet is open.
func (p *ResumePlan) RestoreFailed() {
	for _, e := range p.Restore {
		p.Retire = append(p.Retire, e, e.Next())
		p.Next[e.RolloutID] = max(p.Next[e.RolloutID], e.Attempt+2)
	}
	p.Restore = nil
	p.CheckpointID = ""
}

// Restarts are the rows the plan starts over: every retired attempt's row.
func (p *ResumePlan) Restarts() map[string]bool {
	out := make(map[string]bool, len(p.Retire))
	for _, e := range p.Retire {
		out[e.RolloutID] = true
	}
	return out
}

// ScanOutput reads an output JSONL and returns the rollout ids of its rows
// (each row carries _ng_rollout_id) and the length of its complete lines.
// A last line without its newline was cut short by a crash: it is not
// counted, and complete is where the caller truncates the file before
// appending. Any other line that is not a JSON object with a string
// _ng_rollout_id is an error naming its line.
func ScanOutput(r io.Reader) (finished map[string]bool, complete int64, err error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, 0, err
	}
	finished = map[string]bool{}
	complete = int64(bytes.LastIndexByte(data, '\n') + 1)
	for n, line := range bytes.Split(data[:complete], []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		var row struct {
			RolloutID *string `json:"_ng_rollout_id"`
		}
		if err := codec.Unmarshal(line, &row); err != nil || row.RolloutID == nil {
			return nil, 0, fmt.Errorf("output line %d is not a row with %s: fix or remove it before resuming", n+1, rollout.FieldRolloutID)
		}
		finished[*row.RolloutID] = true
	}
	return finished, complete, nil
}

// openOutputForResume scans path, cuts a torn last line off and opens it
// to append (creating it if missing).
func openOutputForResume(path string) (*os.File, map[string]bool, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, err
	}
	finished, complete, err := ScanOutput(f)
	if err == nil {
		var st os.FileInfo
		if st, err = f.Stat(); err == nil && st.Size() != complete {
			err = f.Truncate(complete)
		}
	}
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, finished, nil
}

func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
