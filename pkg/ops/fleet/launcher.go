package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
)

// Defaults for Options.
const (
	DefaultReadyTimeout = 60 * time.Second
	DefaultStopGrace    = 10 * time.Second
	DefaultPollInterval = 25 * time.Millisecond
	// LogTailBytes is how much of a log Logs returns.
	LogTailBytes = 16 << 10
)

// Options tune a Launcher.
type Options struct {
	// ReadyTimeout bounds one process's wait for readiness (a shorter
	// context deadline wins).
	ReadyTimeout time.Duration
	// StopGrace is how long Stop waits after SIGTERM before SIGKILL.
	StopGrace time.Duration
	// PollInterval is the pause between readiness probes.
	PollInterval time.Duration
	// Environ is the environment processes start from; nil means os.Environ().
	Environ []string
}

// Launcher starts, stops and kills the local processes of a fleet. Each
// process runs in its own process group, so a stop or a kill reaches every
// process it started too. It is safe for concurrent use.
type Launcher struct {
	cfg    *Config
	opts   Options
	client *http.Client
	// tlsErr is why the fleet's CA file could not be loaded, or nil.
	tlsErr error

	mu    sync.Mutex
	procs map[string]*proc
}

// proc is one started process. done closes when the waiter goroutine has
// reaped it; waitErr is set before that.
type proc struct {
	spec    Process
	cmd     *exec.Cmd
	pgid    int
	done    chan struct{}
	waitErr error
}

// ErrUnknownProcess reports a name that is not in the fleet file.
var ErrUnknownProcess = errors.New("no such process in the fleet file")

// NewLauncher returns a launcher for cfg's processes.
func NewLauncher(cfg *Config, opts Options) *Launcher {
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = DefaultReadyTimeout
	}
	if opts.StopGrace <= 0 {
		opts.StopGrace = DefaultStopGrace
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = DefaultPollInterval
	}
	if opts.Environ == nil {
		opts.Environ = os.Environ()
	}
	// Readiness probes only; a probe that hangs is just a failed probe.
	// https:// endpoints are verified against the fleet's CA; a CA file
	// that cannot be read fails every probe with its error.
	tr := &http.Transport{DisableKeepAlives: true, Proxy: nil}
	tlsConf, tlsErr := cfg.HTTP.Conf(cfg.BaseDir).TLS.ClientConfig()
	if tlsErr == nil {
		tlsConf.NextProtos = []string{httpconf.ALPNHTTP11} // the transport speaks HTTP/1.1 only
		tr.TLSClientConfig = tlsConf
	}
	return &Launcher{
		cfg:    cfg,
		opts:   opts,
		client: &http.Client{Timeout: 2 * time.Second, Transport: tr},
		tlsErr: tlsErr,
		procs:  make(map[string]*proc),
	}
}

// Config returns the fleet file the launcher runs.
func (l *Launcher) Config() *Config { return l.cfg }

// StartAll starts every local process in file order, each waited ready
// before the next starts. On failure it stops the processes it started and
// returns the error (with the failed process's log tail).
func (l *Launcher) StartAll(ctx context.Context) error {
	var started []string
	for _, p := range l.cfg.Processes {
		if !p.Local() {
			continue
		}
		if err := l.Start(ctx, p.Name); err != nil {
			for i := len(started) - 1; i >= 0; i-- {
				_ = l.Stop(started[i])
			}
			return err
		}
		started = append(started, p.Name)
	}
	return nil
}

// Start starts one process and waits until every endpoint it serves answers
// GET /readyz with 200. A process that exits, or is not ready by the
// deadline, is killed and reported with its log tail.
func (l *Launcher) Start(ctx context.Context, name string) error {
	p, err := l.start(name)
	if err != nil {
		return err
	}
	if err := l.waitReady(ctx, p); err != nil {
		_ = l.Kill(name)
		return fmt.Errorf("process %s: %w\n--- last lines of %s ---\n%s", name, err, l.cfg.LogPath(name), l.Logs(name))
	}
	return nil
}

func (l *Launcher) start(name string) (*proc, error) {
	spec, ok := l.cfg.Process(name)
	if !ok {
		return nil, fmt.Errorf("process %s: %w", name, ErrUnknownProcess)
	}
	if !spec.Local() {
		return nil, fmt.Errorf("process %s runs on host %s: start it there (see deploy/README.md)", name, spec.Host)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.procs[name]; p != nil && !p.exited() {
		return nil, fmt.Errorf("process %s is already running (pid %d)", name, p.pgid)
	}

	bin := l.cfg.BinaryPath(spec)
	if err := checkExecutable(bin); err != nil {
		return nil, fmt.Errorf("process %s: binary %w (build the servers first, e.g. make build)", name, err)
	}
	// A server that already answers on an endpoint would pass the readiness
	// check for this one: refuse rather than report someone else's server.
	for _, e := range spec.Endpoints {
		if l.probe(context.Background(), e.URL) == nil {
			return nil, fmt.Errorf("process %s: endpoint %s (%s) already answers before start: is another fleet running?", name, e.Name, e.URL)
		}
	}

	logPath, addrPath := l.cfg.LogPath(name), l.cfg.AddrPath(name)
	for _, dir := range []string{filepath.Dir(logPath), filepath.Dir(addrPath)} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("process %s: %w", name, err)
		}
	}
	if err := os.Remove(addrPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("process %s: %w", name, err)
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("process %s: log file: %w", name, err)
	}

	args := []string{}
	if spec.Config != "" {
		args = append(args, "--config", l.cfg.Path(spec.Config))
	}
	args = append(args, "--addr-file", addrPath)
	args = append(args, spec.Args...)
	cmd := exec.Command(bin, args...)
	cmd.Dir = l.cfg.BaseDir
	cmd.Env = l.environ(spec)
	jl := jsonLog{mu: &sync.Mutex{}, w: logFile, process: name}
	stdout, stderr := jl.stream("stdout", "INFO"), jl.stream("stderr", "ERROR")
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	jl.line("INFO", "gymfleet launcher: starting", map[string]any{"bin": bin, "args": strings.Join(args, " ")})
	if err := cmd.Start(); err != nil {
		jl.line("ERROR", "gymfleet launcher: start failed", map[string]any{"err": err.Error()})
		logFile.Close()
		return nil, fmt.Errorf("process %s: start %s: %w", name, bin, err)
	}
	p := &proc{spec: spec, cmd: cmd, pgid: cmd.Process.Pid, done: make(chan struct{})}
	// The one waiter per process: it reaps the child and closes the log, so
	// nothing else ever calls Wait or reads ProcessState before done closes.
	go func() {
		err := cmd.Wait()
		stdout.Flush()
		stderr.Flush()
		jl.line("INFO", "gymfleet launcher: exited", map[string]any{"exit": describeExit(cmd.ProcessState, err)})
		logFile.Close()
		p.waitErr = err
		close(p.done)
	}()
	l.procs[name] = p
	return p, nil
}

// environ is the launcher's environment, then the shared checkpoint and
// http blocks, then the process's own variables (later entries win in
// exec).
func (l *Launcher) environ(spec Process) []string {
	env := append([]string(nil), l.opts.Environ...)
	if l.cfg.HTTP.Stack != "" {
		env = append(env, "GYMFLEET_HTTP_STACK="+string(l.cfg.HTTP.Stack))
	}
	tc := l.cfg.HTTP.Conf(l.cfg.BaseDir).TLS
	for _, v := range []struct{ name, path string }{
		{"GYMFLEET_HTTP_TLS_CERT_FILE", tc.CertFile}, {"GYMFLEET_HTTP_TLS_KEY_FILE", tc.KeyFile}, {"GYMFLEET_HTTP_TLS_CA_FILE", tc.CAFile},
	} {
		if v.path != "" {
			env = append(env, v.name+"="+v.path)
		}
	}
	if l.cfg.Checkpoint.Enabled {
		env = append(env,
			"GYMFLEET_CHECKPOINT_ENABLED=true",
			"GYMFLEET_CHECKPOINT_CONTROL_AUTH_TOKEN="+l.cfg.Checkpoint.ControlAuthToken,
			"GYMFLEET_CHECKPOINT_ROOT="+l.cfg.Path(l.cfg.Checkpoint.Root))
		if l.cfg.Checkpoint.S3Endpoint != "" {
			env = append(env, "GYMFLEET_CHECKPOINT_S3_ENDPOINT="+l.cfg.Checkpoint.S3Endpoint)
		}
		if l.cfg.Checkpoint.S3PathStyle {
			env = append(env, "GYMFLEET_CHECKPOINT_S3_PATH_STYLE=true")
		}
		if l.cfg.Checkpoint.SigningKeyFile != "" {
			// The path, never the key: the environment is readable by more
			// than the file need be.
			env = append(env, "GYMFLEET_CHECKPOINT_SIGNING_KEY_FILE="+l.cfg.Path(l.cfg.Checkpoint.SigningKeyFile))
		}
	}
	for _, e := range spec.Env {
		env = append(env, e.Name+"="+e.Value)
	}
	return env
}

func checkExecutable(path string) error {
	st, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%s not found", path)
	}
	if err != nil {
		return err
	}
	if st.IsDir() || st.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", path)
	}
	return nil
}

// waitReady polls every endpoint's /readyz until it answers 200, the process
// exits, the context ends or ReadyTimeout passes.
func (l *Launcher) waitReady(ctx context.Context, p *proc) error {
	ctx, cancel := context.WithTimeout(ctx, l.opts.ReadyTimeout)
	defer cancel()
	tick := time.NewTicker(l.opts.PollInterval)
	defer tick.Stop()
	for _, e := range p.spec.Endpoints {
		var last error
		for {
			err := l.probe(ctx, e.URL)
			if err == nil {
				break
			}
			if ctx.Err() == nil {
				// The probe's own failure, not the deadline cutting it off.
				last = err
			}
			select {
			case <-p.done:
				return fmt.Errorf("exited before endpoint %s was ready: %v", e.Name, p.exitError())
			case <-ctx.Done():
				return fmt.Errorf("endpoint %s (%s) not ready: %w (last probe: %v)", e.Name, e.URL, context.Cause(ctx), last)
			case <-tick.C:
			}
		}
	}
	return nil
}

// probe GETs <url>/readyz once.
func (l *Launcher) probe(ctx context.Context, base string) error {
	if l.tlsErr != nil {
		return l.tlsErr
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/readyz", nil)
	if err != nil {
		return err
	}
	resp, err := l.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/readyz answered %d", resp.StatusCode)
	}
	return nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// describeExit says how a process ended: its exit status, or the signal
// that killed it.
func describeExit(st *os.ProcessState, err error) string {
	if st == nil {
		if err != nil {
			return err.Error()
		}
		return "not started"
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return "killed by signal " + ws.Signal().String()
	}
	return fmt.Sprintf("exited with status %d", st.ExitCode())
}

// exitError is the process's exit status; call only after done closed.
func (p *proc) exitError() error {
	if p.waitErr == nil {
		return errors.New("exit status 0")
	}
	return p.waitErr
}

func (l *Launcher) get(name string) *proc {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.procs[name]
}

// Stop asks a process to stop (SIGTERM to its process group), waits up to
// StopGrace, then kills the group. It returns once the process is reaped. A
// process that is not running is not an error.
func (l *Launcher) Stop(name string) error {
	p := l.get(name)
	if p == nil || p.exited() {
		return nil
	}
	_ = syscall.Kill(-p.pgid, syscall.SIGTERM)
	timer := time.NewTimer(l.opts.StopGrace)
	defer timer.Stop()
	select {
	case <-p.done:
		// Whatever the server left in its group (it should leave nothing)
		// goes with it.
		_ = syscall.Kill(-p.pgid, syscall.SIGKILL)
		return nil
	case <-timer.C:
	}
	return l.Kill(name)
}

// Kill kills a process's whole group with SIGKILL (a crash) and returns once
// the process is reaped.
func (l *Launcher) Kill(name string) error {
	p := l.get(name)
	if p == nil || p.exited() {
		// Never signal a reaped leader's id: it may belong to someone else now.
		return nil
	}
	if err := syscall.Kill(-p.pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("process %s: kill: %w", name, err)
	}
	return p.wait(name)
}

// wait bounds the wait for a SIGKILLed process: it can only outlive the
// signal in uninterruptible sleep.
func (p *proc) wait(name string) error {
	timer := time.NewTimer(30 * time.Second)
	defer timer.Stop()
	select {
	case <-p.done:
		return nil
	case <-timer.C:
		return fmt.Errorf("process %s (pid %d) did not exit 30s after SIGKILL", name, p.pgid)
	}
}

// KillAll kills every running process at once, as a host crash would, and
// waits until all are reaped.
func (l *Launcher) KillAll() error {
	l.mu.Lock()
	procs := make(map[string]*proc, len(l.procs))
	for n, p := range l.procs {
		procs[n] = p
	}
	l.mu.Unlock()
	for _, p := range procs {
		if !p.exited() {
			_ = syscall.Kill(-p.pgid, syscall.SIGKILL)
		}
	}
	var errs []error
	for n, p := range procs {
		errs = append(errs, p.wait(n))
	}
	return errors.Join(errs...)
}

// StopAll stops every process in reverse start order.
func (l *Launcher) StopAll() error {
	var errs []error
	names := l.cfg.Names()
	for i := len(names) - 1; i >= 0; i-- {
		errs = append(errs, l.Stop(names[i]))
	}
	return errors.Join(errs...)
}

// Restart stops the process if it runs and starts a fresh one.
func (l *Launcher) Restart(ctx context.Context, name string) error {
	if err := l.Stop(name); err != nil {
		return err
	}
	return l.Start(ctx, name)
}

// Running reports whether the process was started and has not exited.
func (l *Launcher) Running(name string) bool {
	p := l.get(name)
	return p != nil && !p.exited()
}

// PID is the process's id (and process group id), 0 if never started.
func (l *Launcher) PID(name string) int {
	if p := l.get(name); p != nil {
		return p.pgid
	}
	return 0
}

// Exited returns a channel closed when the current process of that name
// exits, and nil if it was never started.
func (l *Launcher) Exited(name string) <-chan struct{} {
	if p := l.get(name); p != nil {
		return p.done
	}
	return nil
}

// ExitErr is how the process ended: nil while it runs or after a clean exit.
func (l *Launcher) ExitErr(name string) error {
	p := l.get(name)
	if p == nil || !p.exited() {
		return nil
	}
	return p.waitErr
}

// ExitReason says how the process ended and why: its exit status or
// signal, and the error its log ends with. "running" while it runs.
func (l *Launcher) ExitReason(name string) string {
	p := l.get(name)
	switch {
	case p == nil:
		return "never started"
	case !p.exited():
		return "running"
	}
	r := describeExit(p.cmd.ProcessState, p.waitErr)
	if why := lastError(l.Logs(name)); why != "" {
		r += ": " + why
	}
	return r
}

// Logs returns the tail of the process's log file (its stdout and stderr,
// across restarts).
func (l *Launcher) Logs(name string) string {
	f, err := os.Open(l.cfg.LogPath(name))
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := st.Size() - LogTailBytes
	if off < 0 {
		off = 0
	}
	b, err := io.ReadAll(io.NewSectionReader(f, off, st.Size()-off))
	if err != nil {
		return ""
	}
	if off > 0 {
		// Start at a line boundary.
		if i := strings.IndexByte(string(b), '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

// Addresses reads the process's address file: endpoint name → host:port
// as the server bound it. It is written once the server listens.
func (l *Launcher) Addresses(name string) (map[string]string, error) {
	b, err := os.ReadFile(l.cfg.AddrPath(name))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			out[f[0]] = f[1]
		}
	}
	return out, nil
}
