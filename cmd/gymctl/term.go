package main

import (
	"io"
	"os"

	"golang.org/x/term"
)

// isTerminal reports whether w is a terminal: only then does gymctl draw
// (a progress bar, a redrawn table); a log file or a pipe gets plain lines.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
