package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/checkpoint/coordination"
	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// ckptOptions are the flags every gymctl ckpt operation shares.
type ckptOptions struct {
	config   string
	token    string
	id       string
	dir      string
	episodes string
	rollouts string
	timeout  time.Duration
	stop     bool
	json     bool
	// keyFile is the signing key verify checks manifests' signatures with.
	keyFile string
	// s3 reaches the object store of an s3:// --dir (the fleet file's).
	s3 ckptstore.S3Options
	// watch redraws status every interval until Ctrl-C.
	watch    bool
	interval time.Duration
	// tty says stdout is a terminal (frames replace each other).
	tty bool
	// gymConfig and gymHead name the participants by a NeMo Gym global
	// config instead of the fleet file's endpoints: a YAML file, or the
	// head server that serves it.
	gymConfig string
	gymHead   string
}

var ckptOps = []struct{ name, summary string }{
	{"status", "every participant's kind, phase, checkpoint, lease and counts"},
	{"prepare", "prepare a checkpoint stage by stage (--id)"},
	{"commit", "commit a prepared checkpoint (--id --dir --episodes)"},
	{"resume", "resume (or abort) a checkpoint everywhere (--id)"},
	{"restore", "restore a checkpoint into fresh processes (--id --dir --episodes)"},
	{"retire", "retire attempts everywhere (--episodes)"},
	{"forget", "forget retired rollouts everywhere (--rollouts)"},
	{"verify", "verify a committed checkpoint directory (--id --dir [--signing-key-file])"},
}

func ckptUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: gymctl ckpt <operation> --config fleet.yaml [flags]")
	for _, op := range ckptOps {
		fmt.Fprintf(w, "  %-8s %s\n", op.name, op.summary)
	}
	fmt.Fprintln(w, "--episodes is a comma-separated list of capture keys (r for attempt 0, r-aN for attempt N)")
}

func runCkpt(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		ckptUsage(stderr)
		if len(args) == 0 {
			return errors.New("ckpt: no operation")
		}
		return nil
	}
	op := args[0]
	known := false
	for _, o := range ckptOps {
		known = known || o.name == op
	}
	if !known {
		ckptUsage(stderr)
		return fmt.Errorf("ckpt: unknown operation %q", op)
	}
	var o ckptOptions
	fs := newFlagSet("ckpt "+op, stderr)
	fs.StringVar(&o.config, "config", "configs/local.yaml", "fleet file")
	fs.StringVar(&o.token, "token", "", "control token (default: the Gym config's checkpoint.control_auth_token, the fleet file's, or GYMFLEET_CHECKPOINT_CONTROL_AUTH_TOKEN)")
	fs.StringVar(&o.id, "id", "", "checkpoint id")
	fs.StringVar(&o.dir, "dir", "", "checkpoint directory (absolute, reachable by every server)")
	fs.StringVar(&o.episodes, "episodes", "", "comma-separated capture keys: the scope of commit and restore, the attempts to retire")
	fs.StringVar(&o.rollouts, "rollouts", "", "comma-separated rollout ids to forget")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "deadline of the operation")
	fs.BoolVar(&o.stop, "stop", false, "commit: the controller stops after this checkpoint")
	fs.BoolVar(&o.json, "json", false, "print the result as JSON")
	fs.BoolVar(&o.watch, "watch", false, "status: redraw every --interval until Ctrl-C")
	fs.DurationVar(&o.interval, "interval", time.Second, "status --watch: time between redraws")
	fs.StringVar(&o.keyFile, "signing-key-file", "", "verify: check manifests' signatures with this key file (default: the fleet file's checkpoint.signing_key_file)")
	fs.StringVar(&o.gymConfig, "gym-config", "", "discover the participants from this NeMo Gym global config (YAML) instead of the fleet file's endpoints")
	fs.StringVar(&o.gymHead, "gym-head", "", "discover the participants from the global config this NeMo Gym head server serves (http://host:port)")
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	if o.gymConfig != "" && o.gymHead != "" {
		return errors.New("ckpt: --gym-config and --gym-head are exclusive")
	}
	cfg, err := fleet.Load(o.config)
	if err != nil {
		return err
	}
	if o.keyFile == "" && cfg.Checkpoint.SigningKeyFile != "" {
		o.keyFile = cfg.Path(cfg.Checkpoint.SigningKeyFile)
	}
	// A Gym global config names the fleet and, in its checkpoint: block,
	// the token its own controllers use.
	gymDoc, err := gymConfigDoc(ctx, o)
	if err != nil {
		return fmt.Errorf("ckpt: %w", err)
	}
	if o.token == "" && gymDoc != nil {
		if o.token, err = coordination.GymCheckpointToken(gymDoc); err != nil {
			return fmt.Errorf("ckpt: %w", err)
		}
	}
	if o.token == "" {
		o.token = cfg.Checkpoint.ControlAuthToken
	}
	o.s3 = ckptstore.S3Options{Endpoint: cfg.Checkpoint.S3Endpoint, PathStyle: cfg.Checkpoint.S3PathStyle}
	if o.token == "" {
		o.token = getenv("GYMFLEET_CHECKPOINT_CONTROL_AUTH_TOKEN")
	}
	if o.token == "" {
		return errors.New("ckpt: no control token: set checkpoint.control_auth_token in the fleet file or the Gym config, --token or GYMFLEET_CHECKPOINT_CONTROL_AUTH_TOKEN")
	}
	if o.dir != "" {
		if o.dir, err = checkpointDir(cfg, o.dir); err != nil {
			return fmt.Errorf("ckpt: %w", err)
		}
	}
	hc, err := fleetHTTP(cfg, getenv)
	if err != nil {
		return err
	}
	eps, err := ckptEndpoints(gymDoc, cfg)
	if err != nil {
		return fmt.Errorf("ckpt: %w", err)
	}
	tp, err := newTracer(ctx, getenv)
	if err != nil {
		return err
	}
	defer shutdownTracer(tp)
	// A restore reads the checkpoint's manifests to place former replicas
	// on live ones: it checks their signatures and reaches their store.
	store := ckptstore.Options{S3: o.s3}
	if o.keyFile != "" {
		if store.SigningKey, err = ckptstore.LoadSigningKey(o.keyFile); err != nil {
			return fmt.Errorf("ckpt: %w", err)
		}
	}
	c, err := coordination.Discover(ctx, eps, coordination.Options{Token: o.token, HTTP: hc, Tracer: tp, Store: store})
	if err != nil {
		return err
	}
	o.tty = isTerminal(stdout)
	return ckptOp(ctx, c, op, o, stdout)
}

func need(op string, pairs ...string) error {
	for i := 0; i < len(pairs); i += 2 {
		if pairs[i+1] == "" {
			return fmt.Errorf("ckpt %s: --%s is required", op, pairs[i])
		}
	}
	return nil
}

func parseEpisodes(s string) ([]rollout.EpisodeID, error) {
	out := []rollout.EpisodeID{}
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		if k == "" {
			continue
		}
		id, err := rollout.ParseCaptureKey(k)
		if err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, nil
}

func ckptOp(ctx context.Context, c *coordination.Coordinator, op string, o ckptOptions, stdout io.Writer) error {
	deadline := time.Now().Add(o.timeout)
	episodes, err := parseEpisodes(o.episodes)
	if err != nil {
		return err
	}
	switch op {
	case "status":
		if o.watch {
			if o.interval <= 0 {
				return errors.New("ckpt status: --interval must be positive")
			}
			t := time.NewTicker(o.interval)
			defer t.Stop()
			return watchLoop(ctx, stdout, o.tty, t.C, func(ctx context.Context) []byte {
				st, err := c.Status(ctx)
				return statusFrame(c.Members(), st, err, time.Now())
			})
		}
		st, err := c.Status(ctx)
		if o.json {
			return printJSON(stdout, st)
		}
		printStatus(stdout, c.Members(), st)
		return err
	case "prepare":
		if err := need(op, "id", o.id); err != nil {
			return err
		}
		res, err := c.Prepare(ctx, o.id, deadline)
		if res != nil {
			if o.json {
				_ = printJSON(stdout, res)
			} else {
				printPrepare(stdout, res)
			}
		}
		if err != nil {
			return err
		}
		if !res.Prepared {
			return fmt.Errorf("checkpoint %s is not prepared; resume it (abort), retire the blockers, or prepare again", o.id)
		}
		return nil
	case "commit":
		if err := need(op, "id", o.id, "dir", o.dir); err != nil {
			return err
		}
		res, err := c.Commit(ctx, o.id, o.dir, episodes, deadline, o.stop)
		if err != nil {
			return err
		}
		if o.json {
			return printJSON(stdout, res)
		}
		fmt.Fprintf(stdout, "checkpoint %s committed to %s: %d episode(s) exported\n", o.id, o.dir, len(res.Exported()))
		for _, m := range c.Members() {
			fmt.Fprintf(stdout, "  %-16s %s\n", m.Name, strings.Join(res.ExportedBy(m.Name), " "))
		}
		return nil
	case "resume":
		if err := need(op, "id", o.id); err != nil {
			return err
		}
		if err := c.Resume(ctx, o.id, deadline); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "checkpoint %s resumed on %d participant(s)\n", o.id, len(c.Members()))
		return nil
	case "restore":
		if err := need(op, "id", o.id, "dir", o.dir); err != nil {
			return err
		}
		res, err := c.Restore(ctx, o.id, o.dir, episodes, deadline)
		if err != nil {
			return err
		}
		if o.json {
			return printJSON(stdout, res)
		}
		fmt.Fprintf(stdout, "checkpoint %s restored; admission stays closed until `gymctl ckpt resume --id %s`\n", o.id, o.id)
		for name, r := range res.Replies {
			fmt.Fprintf(stdout, "  %-16s %s\n", name, strings.Join(r.Restored, " "))
		}
		return nil
	case "retire":
		if len(episodes) == 0 {
			return fmt.Errorf("ckpt retire: --episodes is required")
		}
		if err := c.Retire(ctx, o.id, episodes, deadline); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "retired %d attempt(s) everywhere\n", len(episodes))
		return nil
	case "forget":
		var ids []string
		for _, r := range strings.Split(o.rollouts, ",") {
			if r = strings.TrimSpace(r); r != "" {
				ids = append(ids, r)
			}
		}
		if len(ids) == 0 {
			return fmt.Errorf("ckpt forget: --rollouts is required")
		}
		if err := c.Forget(ctx, ids, deadline); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "forgot %d rollout(s) everywhere\n", len(ids))
		return nil
	case "verify":
		if err := need(op, "id", o.id, "dir", o.dir); err != nil {
			return err
		}
		var key []byte
		if o.keyFile != "" {
			var err error
			if key, err = ckptstore.LoadSigningKey(o.keyFile); err != nil {
				return fmt.Errorf("ckpt verify: %w", err)
			}
		}
		ms, err := c.VerifyWith(ctx, o.dir, o.id, ckptstore.Options{SigningKey: key, S3: o.s3})
		signed := 0
		for _, m := range ms {
			fmt.Fprintf(stdout, "%-12s %-16s %6d records  %s\n", m.Kind, m.Instance, m.RecordCount, m.RecordsFile)
			if m.HMAC != "" {
				signed++
			}
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "checkpoint %s in %s verifies\n", o.id, o.dir)
		switch {
		case key != nil:
			fmt.Fprintf(stdout, "every manifest is signed with the key in %s\n", o.keyFile)
		case signed > 0:
			// Said, not skipped silently: a signature not checked proves nothing.
			fmt.Fprintf(stdout, "%d of %d manifests carry a signature, NOT checked: no signing key (--signing-key-file or checkpoint.signing_key_file)\n", signed, len(ms))
		default:
			fmt.Fprintln(stdout, "no manifest is signed")
		}
		return nil
	}
	return fmt.Errorf("ckpt: unknown operation %q", op)
}

func printJSON(w io.Writer, v any) error {
	b, err := codec.MarshalIndent(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

func printStatus(w io.Writer, members []coordination.Member, st map[string]map[string]any) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVER\tKIND\tINSTANCE\tPHASE\tCHECKPOINT\tLEASE\tREADY\tBLOCKERS\tRETIRED\tCOUNTS")
	for _, m := range members {
		s, ok := st[m.Name]
		if !ok {
			fmt.Fprintf(tw, "%s\t%s\t%s\tunreachable\t\t\t\t\t\t\n", m.Name, m.Kind, m.Instance)
			continue
		}
		c := statusCellsOf(s, time.Now())
		counts := ""
		if cm, ok := c.report["counts"].(map[string]any); ok {
			keys := make([]string, 0, len(cm))
			for k := range cm {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				counts += fmt.Sprintf("%s=%v ", k, cm[k])
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\t%s\t%s\t%s\t%v\t%s\n", m.Name, m.Kind, m.Instance, s["phase"], c.checkpoint, c.lease, c.ready, c.blockers, s["retired_rollouts"], strings.TrimSpace(counts))
	}
	tw.Flush()
}

func printPrepare(w io.Writer, res *coordination.PrepareResult) {
	for _, stage := range res.Stages {
		names := make([]string, 0, len(stage.Replies))
		for n := range stage.Replies {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(w, "stage %-12s %8.3fs\n", stage.Kind, stage.Duration.Seconds())
		for _, n := range names {
			r := stage.Replies[n]
			fmt.Fprintf(w, "  %-16s %-10s blockers=%d restarts=%d", n, r.Phase, r.Report.BlockerCount, len(r.Report.Restarts))
			if len(r.Report.Blockers) > 0 {
				fmt.Fprintf(w, " [%s]", strings.Join(r.Report.Blockers, " "))
			}
			fmt.Fprintln(w)
		}
	}
	fmt.Fprintf(w, "prepared: %v\n", res.Prepared)
}

// checkpointDir makes dir absolute (a relative one is relative to the
// working directory) and, where the fleet file names its checkpoint root,
// refuses one outside it: every server would refuse it, after the rows or
// the prepare it follows.
func checkpointDir(cfg *fleet.Config, dir string) (string, error) {
	if ckptstore.IsS3(dir) || ckptstore.IsS3(cfg.Checkpoint.Root) {
		// An object store location is not relative to anything.
		if cfg.Checkpoint.Root != "" {
			if err := ckptstore.InRoot(cfg.Checkpoint.Root, dir); err != nil {
				return "", fmt.Errorf("checkpoint directory %s is not beneath the fleet's checkpoint root %s (checkpoint.root), and every server would refuse it", dir, cfg.Checkpoint.Root)
			}
		}
		return dir, nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if cfg.Checkpoint.Root == "" {
		return abs, nil
	}
	root, err := filepath.Abs(cfg.Path(cfg.Checkpoint.Root))
	if err != nil {
		return "", err
	}
	if _, err := ckptstore.Beneath(root, abs); err != nil {
		return "", fmt.Errorf("checkpoint directory %s is not beneath the fleet's checkpoint root %s (checkpoint.root), and every server would refuse it", dir, root)
	}
	return abs, nil
}

// gymConfigDoc is the NeMo Gym global config --gym-config (a file) or
// --gym-head (its head server's /global_config_dict_yaml) names, or nil.
func gymConfigDoc(ctx context.Context, o ckptOptions) ([]byte, error) {
	switch {
	case o.gymConfig != "":
		return os.ReadFile(o.gymConfig)
	case o.gymHead != "":
		return coordination.FetchGymConfig(ctx, nil, o.gymHead)
	}
	return nil, nil
}

// ckptEndpoints are the servers of the Gym global config, if one is
// given, else the fleet file's.
func ckptEndpoints(gymDoc []byte, cfg *fleet.Config) ([]coordination.Endpoint, error) {
	if gymDoc != nil {
		return coordination.EndpointsFromGymConfig(gymDoc)
	}
	var eps []coordination.Endpoint
	for _, p := range cfg.Processes {
		for _, e := range p.Endpoints {
			eps = append(eps, coordination.Endpoint{Name: e.Name, URL: e.URL})
		}
	}
	return eps, nil
}
