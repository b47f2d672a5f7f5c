package scalebench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"
)

// profiler takes profiles of every server process through its
// /debug/pprof/ routes (the fleet runs with pprof on when profiling).
type profiler struct {
	b   *bench
	dir string
}

// profileLeadIn is the pause between sending the CPU profile requests and
// starting the phase they profile.
const profileLeadIn = 100 * time.Millisecond

func newProfiler(b *bench, dir string) *profiler { return &profiler{b: b, dir: dir} }

// runtimeURL is one running process's runtime, reached through its first
// endpoint: a process serving several endpoints has one runtime, so one
// profile and one set of runtime metrics.
type runtimeURL struct {
	name, url string
}

// runtimeURLs lists every running process that serves an endpoint.
func (b *bench) runtimeURLs() []runtimeURL {
	var out []runtimeURL
	for _, proc := range b.cfg.Processes {
		if len(proc.Endpoints) > 0 && b.launcher.Running(proc.Name) {
			out = append(out, runtimeURL{name: proc.Name, url: strings.TrimRight(proc.Endpoints[0].URL, "/")})
		}
	}
	return out
}

// startCPU starts a CPU profile of ProfileSeconds on every server and
// returns once each request is on the wire plus a lead-in, so the phase
// that follows falls inside every profile. wait blocks until every profile
// is written.
func (p *profiler) startCPU(ctx context.Context, phase string) (wait func(), err error) {
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return nil, err
	}
	p.b.res.ProfilesDir = p.dir
	secs := p.b.opts.ProfileSeconds
	targets := p.b.runtimeURLs()
	var wg sync.WaitGroup
	written := make(chan struct{}, len(targets))
	for _, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			path := filepath.Join(p.dir, fmt.Sprintf("cpu-%s-%s.pb.gz", phase, t.name))
			url := t.url + "/debug/pprof/profile?seconds=" + strconv.Itoa(secs)
			var once sync.Once
			signal := func() { once.Do(func() { written <- struct{}{} }) }
			defer signal() // a request that failed before it was written
			tctx := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { signal() }})
			if err := p.fetch(tctx, url, path, time.Duration(secs)*time.Second+time.Minute); err != nil {
				p.b.logf("CPU profile of %s during %s: %v", t.name, phase, err)
			}
		}()
	}
	// The bench's own share: it drives every /run.
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := p.self(ctx, filepath.Join(p.dir, fmt.Sprintf("cpu-%s-bench.pb.gz", phase)), time.Duration(secs)*time.Second); err != nil {
			p.b.logf("CPU profile of the bench during %s: %v", phase, err)
		}
	}()
	wait = func() { wg.Wait() }
	for range targets {
		select {
		case <-written:
		case <-ctx.Done():
			wait()
			return nil, context.Cause(ctx)
		}
	}
	// Nothing tells a client that recording began: the profile's reply
	// starts only when it ends, and the profile writer's goroutine in a
	// goroutine dump is a signal that costs more CPU, at 100,000
	// goroutines, than the phases profiled. A request on the wire reaches
	// its handler within this lead-in on a loaded machine; a phase that
	// began a little earlier only loses its first milliseconds.
	lead := time.NewTimer(profileLeadIn)
	defer lead.Stop()
	select {
	case <-lead.C:
	case <-ctx.Done():
		wait()
		return nil, context.Cause(ctx)
	}
	return wait, nil
}

// self profiles the bench process for d.
func (p *profiler) self(ctx context.Context, path string, d time.Duration) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		_ = os.Remove(path)
		return err
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-ctx.Done():
	}
	pprof.StopCPUProfile()
	return f.Close()
}

// heap writes a heap profile (of what a collection run first leaves
// live), a goroutine profile and the metrics of every running server:
// at the boundary (label "boundary", every rollout held at its model
// call), at the crash ("first") and after the replacements ("fresh").
func (p *profiler) heap(ctx context.Context, fleetLabel string) {
	if !p.b.opts.Profile {
		return
	}
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		p.b.logf("heap profiles: %v", err)
		return
	}
	p.b.res.ProfilesDir = p.dir
	var wg sync.WaitGroup
	for _, t := range p.b.runtimeURLs() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The goroutine profile and the runtime's own figures
			// (/metrics: stack and heap bytes, goroutines) show what the
			// heap profile cannot: memory held by parked goroutines' stacks.
			for _, snap := range []struct{ what, route, file string }{
				{"heap profile", "/debug/pprof/heap?gc=1", "heap-%s-%s.pb.gz"},
				{"goroutine profile", "/debug/pprof/goroutine", "goroutine-%s-%s.pb.gz"},
				{"metrics", "/metrics", "metrics-%s-%s.txt"},
			} {
				path := filepath.Join(p.dir, fmt.Sprintf(snap.file, fleetLabel, t.name))
				if err := p.fetch(ctx, t.url+snap.route, path, time.Minute); err != nil {
					p.b.logf("%s of %s: %v", snap.what, t.name, err)
				}
			}
		}()
	}
	wg.Wait()
}

// fetch GETs a profile into path.
func (p *profiler) fetch(ctx context.Context, url, path string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := p.b.ctl.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s answered %d: %s", url, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
