package ctlplane

import (
	"errors"
	"time"
)

// DefaultLeaseGrace is how long past a control call's deadline a participant
// stays closed when no further control call arrives (SPEC §3).
const DefaultLeaseGrace = 600 * time.Second

// Config is the checkpoint: block every server's configuration carries.
// With Enabled false the server mounts no /_ckpt route and keeps no
// checkpoint bookkeeping at all.
type Config struct {
	Enabled           bool    `mapstructure:"enabled"`
	ControlAuthToken  string  `mapstructure:"control_auth_token"`
	LeaseGraceSeconds float64 `mapstructure:"lease_grace_seconds"`
	// Root is the directory every checkpoint_dir must lie beneath, reached
	// from it without symbolic links: a control token then writes and
	// reads checkpoint files there and nowhere else. Required when
	// Enabled; a relative root is relative to the working directory, and
	// is created at start if missing.
	Root string `mapstructure:"root"`
}

// DefaultConfig is checkpointing off, with the SPEC's lease grace.
func DefaultConfig() Config {
	return Config{LeaseGraceSeconds: DefaultLeaseGrace.Seconds()}
}

// Validate refuses checkpointing without a token and a non-positive grace.
func (c Config) Validate() error {
	if !c.Enabled {
		return nil
	}
	if c.ControlAuthToken == "" {
		return errors.New("checkpoint.enabled is true but checkpoint.control_auth_token is empty: every control call must be authenticated")
	}
	if c.LeaseGraceSeconds <= 0 {
		return errors.New("checkpoint.lease_grace_seconds must be > 0")
	}
	if c.Root == "" {
		// No default: any default would be a directory the operator did
		// not choose for a token holder to write in.
		return errors.New("checkpoint.enabled is true but checkpoint.root is empty: name the directory every checkpoint_dir must lie beneath")
	}
	return nil
}

// LeaseGrace is the grace as a duration.
func (c Config) LeaseGrace() time.Duration {
	return time.Duration(c.LeaseGraceSeconds * float64(time.Second))
}
