package collect

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Row is one dataset row ready to send to /run.
type Row struct {
	// Line is the row's 1-based line number in the input.
	Line int
	// Fields is the row as read, plus the assigned _ng_task_index and
	// _ng_rollout_index; it is the /run body.
	Fields map[string]codec.RawMessage
	// Episode is the attempt the row names.
	Episode rollout.EpisodeID
	// TaskIndex and RolloutIndex are the row's indices, given or assigned.
	TaskIndex, RolloutIndex int64
	// Agent is agent_ref.name, or empty.
	Agent string
}

// LineIssue is an input line that was not run, and why.
type LineIssue struct {
	Line   int    `json:"line"`
	Reason string `json:"reason"`
}

func (i LineIssue) String() string { return fmt.Sprintf("line %d: %s", i.Line, i.Reason) }

// MaxLineBytes bounds one input line.
const MaxLineBytes = 64 << 20

// parsedLine is a JSON object line before indices are assigned.
type parsedLine struct {
	line   int
	raw    []byte
	fields map[string]codec.RawMessage
	task   *int64
	rindex *int64
}

// ReadRows reads a NeMo Gym JSONL dataset. A line that is not a JSON object,
// or has no responses_create_params object, or names an invalid rollout or
// one an earlier row names (whatever the attempts), is reported as an issue
// and skipped; blank lines are ignored.
// Rows without _ng_task_index get one: identical raw lines share an index,
// assigned in order of first appearance, skipping indices other rows give
// themselves. Rows without _ng_rollout_index get 0, 1, ... per task index.
// limit > 0 keeps the first limit valid rows.
func ReadRows(r io.Reader, limit int) ([]Row, []LineIssue, error) {
	br := bufio.NewReaderSize(r, 1<<20)
	var lines []parsedLine
	var issues []LineIssue
	for n := 1; ; n++ {
		raw, tooLong, err := readLine(br)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, issues, fmt.Errorf("reading line %d: %w", n, err)
		}
		switch {
		case tooLong:
			issues = append(issues, LineIssue{Line: n, Reason: fmt.Sprintf("longer than %d bytes", MaxLineBytes)})
		case raw != nil:
			if pl, issue := parseLine(n, raw); issue != "" {
				issues = append(issues, LineIssue{Line: n, Reason: issue})
			} else if pl != nil && (limit <= 0 || len(lines) < limit) {
				lines = append(lines, *pl)
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
	}
	rows, more := assign(lines)
	issues = append(issues, more...)
	sort.SliceStable(issues, func(i, j int) bool { return issues[i].Line < issues[j].Line })
	return rows, issues, nil
}

// readLine returns the next line without its line ending (nil at a clean
// EOF). A line longer than MaxLineBytes is skipped and reported as tooLong.
func readLine(br *bufio.Reader) (line []byte, tooLong bool, err error) {
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			line = append(line, chunk...)
			if len(line) > MaxLineBytes {
				tooLong, line = true, nil
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if tooLong {
			return nil, true, err
		}
		if errors.Is(err, io.EOF) && len(line) == 0 {
			return nil, false, io.EOF
		}
		return bytes.TrimRight(line, "\r\n"), false, err
	}
}

// parseLine decodes one line; a blank line gives (nil, "").
func parseLine(n int, raw []byte) (*parsedLine, string) {
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 {
		return nil, ""
	}
	if trimmed[0] != '{' || !codec.Valid(trimmed) {
		return nil, "not a JSON object"
	}
	var fields map[string]codec.RawMessage
	if err := codec.Unmarshal(trimmed, &fields); err != nil {
		return nil, "not a JSON object: " + codec.DescribeError(err)
	}
	if p, ok := fields[rollout.FieldParams]; !ok || !isObject(p) {
		return nil, "no responses_create_params object"
	}
	pl := &parsedLine{line: n, raw: trimmed, fields: fields}
	for _, f := range []struct {
		name string
		dst  **int64
	}{{rollout.FieldTaskIndex, &pl.task}, {rollout.FieldRolloutIndex, &pl.rindex}} {
		v, ok := fields[f.name]
		if !ok || isNull(v) {
			continue
		}
		i, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
		if err != nil || i < 0 {
			return nil, fmt.Sprintf("%s must be a non-negative integer, got %s", f.name, v)
		}
		*f.dst = &i
	}
	return pl, ""
}

// assign gives every line its indices and episode, reporting rows whose
// rollout id is invalid or repeats an earlier row's.
func assign(lines []parsedLine) ([]Row, []LineIssue) {
	explicitTasks := map[int64]bool{}
	explicitRollouts := map[int64]map[int64]bool{}
	for _, pl := range lines {
		if pl.task != nil {
			explicitTasks[*pl.task] = true
			if pl.rindex != nil {
				if explicitRollouts[*pl.task] == nil {
					explicitRollouts[*pl.task] = map[int64]bool{}
				}
				explicitRollouts[*pl.task][*pl.rindex] = true
			}
		}
	}
	byRaw := map[string]int64{}
	nextTask := int64(0)
	nextRollout := map[int64]int64{}
	seen := map[string]int{}
	var rows []Row
	var issues []LineIssue
	for _, pl := range lines {
		var task int64
		switch {
		case pl.task != nil:
			task = *pl.task
		default:
			t, ok := byRaw[string(pl.raw)]
			if !ok {
				for explicitTasks[nextTask] {
					nextTask++
				}
				t = nextTask
				nextTask++
				byRaw[string(pl.raw)] = t
			}
			task = t
		}
		var ri int64
		if pl.rindex != nil {
			ri = *pl.rindex
		} else {
			ri = nextRollout[task]
			for explicitRollouts[task][ri] {
				ri++
			}
			nextRollout[task] = ri + 1
		}
		fields := make(map[string]codec.RawMessage, len(pl.fields)+2)
		for k, v := range pl.fields {
			fields[k] = v
		}
		fields[rollout.FieldTaskIndex] = codec.RawMessage(strconv.FormatInt(task, 10))
		fields[rollout.FieldRolloutIndex] = codec.RawMessage(strconv.FormatInt(ri, 10))

		id, err := episodeOf(fields)
		if err != nil {
			issues = append(issues, LineIssue{Line: pl.line, Reason: err.Error()})
			continue
		}
		// A rollout is one row: two attempts of it in one input would run
		// at once and fence each other, and resuming keys rows by rollout.
		if prev, dup := seen[id.RolloutID]; dup {
			issues = append(issues, LineIssue{Line: pl.line, Reason: fmt.Sprintf("rollout %s repeats line %d's", id.RolloutID, prev)})
			continue
		}
		seen[id.RolloutID] = pl.line
		rows = append(rows, Row{Line: pl.line, Fields: fields, Episode: id, TaskIndex: task, RolloutIndex: ri, Agent: agentName(fields)})
	}
	return rows, issues
}

// episodeOf reads a row's episode id as the environment server will.
func episodeOf(fields map[string]codec.RawMessage) (rollout.EpisodeID, error) {
	ident := map[string]any{}
	for _, f := range []string{rollout.FieldRolloutID, rollout.FieldTaskIndex, rollout.FieldRolloutIndex, rollout.FieldAttemptIndex} {
		raw, ok := fields[f]
		if !ok {
			continue
		}
		var v any
		if err := codec.Unmarshal(raw, &v); err != nil {
			return rollout.EpisodeID{}, fmt.Errorf("%s: %s", f, codec.DescribeError(err))
		}
		ident[f] = v
	}
	return rollout.FromRow(ident)
}

func agentName(fields map[string]codec.RawMessage) string {
	raw, ok := fields[rollout.FieldAgentRef]
	if !ok {
		return ""
	}
	var ref struct {
		Name string `json:"name"`
	}
	if codec.Unmarshal(raw, &ref) != nil {
		return ""
	}
	return ref.Name
}

func isObject(raw codec.RawMessage) bool {
	b := bytes.TrimSpace(raw)
	return len(b) > 0 && b[0] == '{'
}

func isNull(raw codec.RawMessage) bool {
	return bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}
