package ctlplane

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of testdata/phases scripts")

// TestStep_Scripts runs the data-driven scripts in testdata/phases: each
// command is one Step input applied to the state the previous ones left, and
// the block after ---- is the expected decision. Run with -rewrite to
// regenerate the expectations, then review the diff.
func TestStep_Scripts(t *testing.T) {
	files, err := filepath.Glob("testdata/phases/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no phase scripts: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			runScript(t, file)
		})
	}
}

type scriptCase struct {
	cmd, want string
	comments  []string
}

func runScript(t *testing.T, file string) {
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	var cases []scriptCase
	var cur *scriptCase
	var pending []string
	sc := bufio.NewScanner(f)
	inWant := false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case inWant && line == "":
			inWant = false
		case inWant:
			cur.want += line + "\n"
		case strings.HasPrefix(line, "#") || line == "":
			pending = append(pending, line)
		case line == "----":
			inWant = true
		default:
			cases = append(cases, scriptCase{cmd: line, comments: pending})
			cur = &cases[len(cases)-1]
			pending = nil
		}
	}
	f.Close()

	var s State
	var out strings.Builder
	for i, c := range cases {
		in, err := parseInput(c.cmd)
		if err != nil {
			t.Fatalf("%s: command %d %q: %v", file, i+1, c.cmd, err)
		}
		d := Step(s, in)
		got := formatDecision(d)
		if !*rewrite && got != c.want {
			t.Errorf("%s: after %q\n got: %s\nwant: %s", file, c.cmd, strings.TrimSpace(got), strings.TrimSpace(c.want))
		}
		if d.Err == nil {
			s = d.Next
		}
		for _, cm := range c.comments {
			out.WriteString(cm + "\n")
		}
		fmt.Fprintf(&out, "%s\n----\n%s\n", c.cmd, got)
	}
	if *rewrite {
		if err := os.WriteFile(file, []byte(strings.TrimRight(out.String(), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func parseInput(cmd string) (Input, error) {
	fields := strings.Fields(cmd)
	var in Input
	ops := map[string]Op{}
	for i, n := range opNames {
		ops[n] = Op(i)
	}
	op, ok := ops[fields[0]]
	if !ok {
		return in, fmt.Errorf("unknown op %q", fields[0])
	}
	in.Op = op
	for _, f := range fields[1:] {
		k, v, hasV := strings.Cut(f, "=")
		switch {
		case !hasV && k == "ready":
			in.Ready = true
		case !hasV && k == "ok":
			in.OK = true
		case !hasV && in.CheckpointID == "":
			in.CheckpointID = k
		case k == "dir":
			in.Dir = v
		case k == "scope":
			in.Scope = v
		default:
			return in, fmt.Errorf("unknown argument %q", f)
		}
	}
	return in, nil
}

func formatDecision(d Decision) string {
	if d.Err != nil {
		return fmt.Sprintf("error=%s\n", d.Err.Code)
	}
	s := d.Next
	var b strings.Builder
	fmt.Fprintf(&b, "phase=%s id=%s action=%s", s.Phase, orDash(s.CheckpointID), d.Action)
	if s.Busy {
		b.WriteString(" busy")
	}
	if s.Dir != "" || s.Scope != "" {
		fmt.Fprintf(&b, " dir=%s scope=%s", orDash(s.Dir), orDash(s.Scope))
	}
	if d.Idempotent {
		b.WriteString(" idempotent")
	}
	if len(s.Resumed) > 0 {
		fmt.Fprintf(&b, " resumed=%s", strings.Join(s.Resumed, ","))
	}
	return b.String() + "\n"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// TestStep_RemembersOnlyTheLast64Resumed checks the bound on resumed ids.
func TestStep_RemembersOnlyTheLast64Resumed(t *testing.T) {
	var s State
	for i := 0; i < RecentlyResumed+10; i++ {
		s = Step(s, Input{Op: OpResume, CheckpointID: fmt.Sprintf("c%d", i)}).Next
	}
	if got, want := len(s.Resumed), RecentlyResumed; got != want {
		t.Fatalf("len(Resumed)=%d, want %d", got, want)
	}
	if d := Step(s, Input{Op: OpPrepare, CheckpointID: "c0"}); d.Err != nil {
		t.Fatalf("c0 fell out of the window and should be accepted, got %v", d.Err)
	}
	if d := Step(s, Input{Op: OpPrepare, CheckpointID: "c73"}); d.Err == nil || d.Err.Code != "stale_checkpoint" {
		t.Fatalf("c73 was resumed recently and must be stale, got %+v", d)
	}
}

// TestStep_DoesNotMutateItsInput guards the purity of Step.
func TestStep_DoesNotMutateItsInput(t *testing.T) {
	s := State{Resumed: make([]string, 3, 100)}
	copy(s.Resumed, []string{"a", "b", "c"})
	_ = Step(s, Input{Op: OpResume, CheckpointID: "d"})
	if got := s.Resumed[:cap(s.Resumed)][3]; got != "" {
		t.Fatalf("Step wrote into the caller's backing array: %q", got)
	}
}
