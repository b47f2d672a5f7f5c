package ctlplane

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
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
	//
	// Root may instead be an object store location, s3://bucket/prefix:
	// every checkpoint_dir must then be an s3:// URL beneath it (the same
	// bucket, within the prefix), and checkpoints are written through the
	// S3 API with credentials from the standard AWS environment and files.
	Root string `mapstructure:"root"`
	// S3Endpoint is the base URL of an S3 server other than AWS (for an
	// s3:// root); empty for AWS itself.
	S3Endpoint string `mapstructure:"s3_endpoint"`
	// S3PathStyle addresses buckets as <endpoint>/<bucket>, which most
	// servers other than AWS need.
	S3PathStyle bool `mapstructure:"s3_path_style"`
	// SigningKeyFile, when set, names a file holding the key (at least 32
	// bytes, less one trailing newline) that signs every manifest this
	// server writes; a restore then refuses a manifest not signed with it.
	// A path, so the key is in neither the YAML nor the environment; read
	// at start.
	SigningKeyFile string `mapstructure:"signing_key_file"`
	// EpochFile holds the fleet's epoch (see Controller.Epoch): one file
	// every server of one fleet reads, and no other fleet's. Default:
	// EPOCH beneath Root, which suits a root one fleet owns.
	EpochFile string `mapstructure:"epoch_file"`
}

// DefaultConfig is checkpointing off, with the SPEC's lease grace.
func DefaultConfig() Config {
	return Config{LeaseGraceSeconds: DefaultLeaseGrace.Seconds()}
}

// Validate refuses checkpointing without a token, a root or a positive
// grace, and a signing key file that holds no usable key.
func (c Config) Validate() error {
	if err := c.validateSettings(); err != nil {
		return err
	}
	if !c.Enabled {
		return nil
	}
	_, err := c.SigningKey()
	return err
}

// validateSettings is Validate without reading the key file.
func (c Config) validateSettings() error {
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
	if ckptstore.IsS3(c.Root) {
		if err := ckptstore.InRoot(c.Root, c.Root); err != nil {
			return fmt.Errorf("checkpoint.root: %w", err)
		}
	}
	return nil
}

// SigningKey reads the key SigningKeyFile names; nil when none is set.
func (c Config) SigningKey() ([]byte, error) {
	if c.SigningKeyFile == "" {
		return nil, nil
	}
	key, err := ckptstore.LoadSigningKey(c.SigningKeyFile)
	if err != nil {
		return nil, fmt.Errorf("checkpoint.signing_key_file: %w", err)
	}
	return key, nil
}

// S3Options are the object store settings of an s3:// root.
func (c Config) S3Options() ckptstore.S3Options {
	return ckptstore.S3Options{Endpoint: c.S3Endpoint, PathStyle: c.S3PathStyle}
}

// EffectiveEpochFile is EpochFile, or EPOCH beneath a local root (none
// beneath an s3:// root: the epoch file is a local, shared file).
func (c Config) EffectiveEpochFile(root string) string {
	if c.EpochFile != "" {
		return c.EpochFile
	}
	if ckptstore.IsS3(root) {
		return ""
	}
	return filepath.Join(root, DefaultEpochFileName)
}

// LeaseGrace is the grace as a duration.
func (c Config) LeaseGrace() time.Duration {
	return time.Duration(c.LeaseGraceSeconds * float64(time.Second))
}
