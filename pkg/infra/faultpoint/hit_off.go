//go:build !gymfleet_faults || !unix

package faultpoint

// Enabled reports whether this build compiles the points in.
const Enabled = false

// Hit does nothing in a build without the gymfleet_faults tag; the
// compiler inlines it away.
func Hit(Point) {}
