// Package runtimetune owns the process-wide steering of the Go runtime that
// a fleet server may opt into (`runtime.tuning`): the servers' GC goal,
// collections deferred while a checkpoint holds admission closed or while
// the process is parked, and a restoring process's heap readied in huge
// pages. All of it leans on the runtime's heuristics as they are, so it is
// one switch, measured by the scale bench with it on and off
// (docs/scale-log.md).
//
// A Tuner is made once per process, by the command's start-up, and handed
// to every server of the process: the runtime's GC settings belong to the
// process, and the Tuner counts the holds of all its servers. Off (or a nil
// *Tuner), every method does nothing and the runtime runs on Go's own
// behaviour.
package runtimetune

import (
	"context"
	"fmt"

	"github.com/gymfleet/gymfleet/pkg/infra/hugepage"
)

// Mode is the `runtime.tuning` key: on or off.
type Mode string

const (
	// On steers the runtime as this package describes.
	On Mode = "on"
	// Off leaves the runtime to Go's own behaviour.
	Off Mode = "off"
)

// DefaultMode is the mode of a configuration that does not set one: Go's
// own runtime. Steering pays on every rollout (a lower GC goal makes
// dispatch collect far more often) to save memory at the rare checkpoint,
// so it is for an operator who asks for it.
const DefaultMode = Off

// Config is the `runtime:` section of every process's configuration.
type Config struct {
	// Tuning is on or off; empty means DefaultMode.
	Tuning Mode `mapstructure:"tuning"`
}

// DefaultConfig is the section with DefaultMode spelled out.
func DefaultConfig() Config { return Config{Tuning: DefaultMode} }

// EffectiveMode is Tuning with the default applied.
func (c Config) EffectiveMode() Mode {
	if c.Tuning == "" {
		return DefaultMode
	}
	return c.Tuning
}

// Validate refuses a mode other than on and off, naming the key.
func (c Config) Validate() error {
	switch c.EffectiveMode() {
	case On, Off:
		return nil
	}
	return fmt.Errorf("runtime.tuning %q: want %q or %q", c.Tuning, On, Off)
}

// Tuner steers the process's runtime when on. Its methods are safe for
// concurrent use; a nil *Tuner is off.
type Tuner struct {
	on   bool
	gc   gcHolds
	idle IdleCollections
}

// New returns the process's Tuner for cfg, which must be valid.
func New(cfg Config) *Tuner {
	return &Tuner{on: cfg.EffectiveMode() == On, idle: DefaultIdleCollections()}
}

// On reports whether the Tuner steers the runtime.
func (t *Tuner) On() bool { return t != nil && t.on }

// SetServerGC applies the servers' GC goal (ServerGCPercent) unless the
// environment's GOGC says otherwise, and returns what restores the goal
// before it. It is for a server command's start-up, before anything
// allocates much; off it does nothing.
func (t *Tuner) SetServerGC(getenv func(string) string) (undo func()) {
	if !t.On() {
		return func() {}
	}
	return setServerGC(getenv)
}

// RunIdle holds collections off while the process is parked
// (IdleCollections) until ctx ends, and releases its hold before
// returning. Off it returns at once.
func (t *Tuner) RunIdle(ctx context.Context) {
	if !t.On() {
		return
	}
	t.idle.runEvery(ctx, &t.gc)
}

// The methods below are the control plane's hooks (ctlplane.Tuning).

// CheckpointStarted defers collections until the matching
// CheckpointFinished: a checkpoint closed admission (prepare, or the start
// of a restore).
func (t *Tuner) CheckpointStarted() {
	if t.On() {
		t.gc.hold(gcHoldHeadroom)
	}
}

// RestoreSized widens the holds to suit installing recordBytes of records
// (installHeadroom). Without a hold it does nothing.
func (t *Tuner) RestoreSized(recordBytes int64) {
	if t.On() {
		t.gc.widen(installHeadroom(recordBytes))
	}
}

// CheckpointFinished ends the hold of one CheckpointStarted; the last one
// gives back GOGC and the memory limit as they were.
func (t *Tuner) CheckpointFinished() {
	if t.On() {
		t.gc.release()
	}
}

// InstallStarting readies the heap, in huge pages, for a fresh process
// about to install recordBytes of records (hugepage.PrepareHeap); done
// withdraws the advice once the install is over.
func (t *Tuner) InstallStarting(recordBytes int64) (done func()) {
	if !t.On() {
		return func() {}
	}
	return hugepage.PrepareHeap(installHeapGrowth(recordBytes)).Release
}

// RequestDecoding defers collections while a control request that names
// every episode (a restore's) is decoded in a fresh process, whose heap of
// a few MB would otherwise be collected again and again; done ends it.
func (t *Tuner) RequestDecoding() (done func()) {
	if !t.On() {
		return func() {}
	}
	t.gc.hold(gcHoldHeadroom)
	return t.gc.release
}

// HeldGCPercent is the GOGC a checkpoint's hold defers collections with,
// for tests that observe the runtime's settings.
const HeldGCPercent = heldGCPercent
