package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/coordination"
)

// clearScreen moves the cursor home and clears the screen: a terminal
// frame replaces the last one.
const clearScreen = "\x1b[H\x1b[2J"

// redraw writes one frame of a watch: on a terminal it replaces the last
// frame; elsewhere (a log, a pipe) frames follow each other as plain text
// under a time line. A frame is one Write, so a reader sees whole frames.
func redraw(w io.Writer, tty bool, now time.Time, frame []byte) error {
	var b bytes.Buffer
	if tty {
		b.WriteString(clearScreen)
	} else {
		fmt.Fprintf(&b, "--- %s\n", now.UTC().Format(time.RFC3339))
	}
	b.Write(frame)
	_, err := w.Write(b.Bytes())
	return err
}

// watchLoop draws a frame at once and then at every tick until ctx ends
// (Ctrl-C), which is a clean end. A frame that fails to build is drawn as
// its error, and the watch goes on.
func watchLoop(ctx context.Context, w io.Writer, tty bool, tick <-chan time.Time, frame func(ctx context.Context) []byte) error {
	for {
		f := frame(ctx)
		if ctx.Err() != nil {
			return nil // a frame cut off by Ctrl-C is not drawn
		}
		if err := redraw(w, tty, time.Now(), f); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
		}
	}
}

// statusCells are the cells of a participant's status that ckpt status
// and its --watch frame both show, "-" where the status has none.
type statusCells struct {
	checkpoint, lease, ready, blockers string
	// report is the participant's report, nil when it sent none.
	report map[string]any
}

// statusCellsOf reads the cells from one participant's GET /_ckpt/status
// reply; the lease is the time left at now.
func statusCellsOf(s map[string]any, now time.Time) statusCells {
	c := statusCells{checkpoint: "-", lease: "-", ready: "-", blockers: "-"}
	if v, ok := s["lease_expires_at"].(float64); ok {
		c.lease = time.Unix(0, int64(v*1e9)).Sub(now).Round(time.Second).String()
	}
	if v, ok := s["checkpoint_id"].(string); ok {
		c.checkpoint = v
	}
	if rep, ok := s["report"].(map[string]any); ok {
		c.report = rep
		c.ready = fmt.Sprint(rep["ready"])
		c.blockers = fmt.Sprint(rep["blocker_count"])
	}
	return c
}

// maxListedBlockers is how many blocker ids a watch row shows.
const maxListedBlockers = 3

// statusFrame is ckpt status --watch's frame: per participant its phase,
// the lease left, readiness, the blocker count and the first blockers.
func statusFrame(members []coordination.Member, st map[string]map[string]any, err error, now time.Time) []byte {
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVER\tKIND\tPHASE\tCHECKPOINT\tLEASE LEFT\tREADY\tBLOCKERS\tFIRST BLOCKERS")
	for _, m := range members {
		s, ok := st[m.Name]
		if !ok {
			fmt.Fprintf(tw, "%s\t%s\tunreachable\t-\t-\t-\t-\t-\n", m.Name, m.Kind)
			continue
		}
		c := statusCellsOf(s, now)
		first := "-"
		if bl, ok := c.report["blockers"].([]any); ok && len(bl) > 0 {
			var ids []string
			for _, v := range bl {
				if len(ids) == maxListedBlockers {
					break
				}
				ids = append(ids, fmt.Sprint(v))
			}
			first = strings.Join(ids, ",")
			if len(bl) > maxListedBlockers {
				first += ",…"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\t%s\t%s\t%s\t%s\t%s\n", m.Name, m.Kind, s["phase"], c.checkpoint, c.lease, c.ready, c.blockers, first)
	}
	tw.Flush()
	if err != nil {
		fmt.Fprintf(&b, "\nerror: %v\n", err)
	}
	return b.Bytes()
}
