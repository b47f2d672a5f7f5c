package scalebench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/prometheus/procfs"
)

// sampleEvery is how often the sampler reads every process's resident
// memory and descriptors.
const sampleEvery = 250 * time.Millisecond

// target is one process the bench watches.
type target struct {
	name, fleet string
	pid         int
}

// memStatus is what the bench reads from /proc/<pid>/status.
type memStatus struct {
	// HWM is VmHWM, the peak resident set, in bytes.
	HWM uint64
	// RSS is VmRSS, the resident set now, in bytes.
	RSS uint64
}

// maxSize bounds a size read from /proc: past it, the value is not a
// resident set (procfs multiplies the kB it reads without a check).
const maxSize = 1 << 54

// openProc opens /proc/<pid>, or the bench's own for pid 0, through
// procfs rooted at root (the kernel's /proc, or a test's tree).
func openProc(root string, pid int) (procfs.Proc, error) {
	fs, err := procfs.NewFS(root)
	if err != nil {
		return procfs.Proc{}, err
	}
	if pid == 0 {
		return fs.Self()
	}
	return fs.Proc(pid)
}

// readStatusAt reads VmHWM and VmRSS from root's <pid>/status.
func readStatusAt(root string, pid int) (memStatus, error) {
	p, err := openProc(root, pid)
	if err != nil {
		return memStatus{}, err
	}
	s, err := p.NewStatus()
	if err != nil {
		return memStatus{}, err
	}
	st := memStatus{HWM: s.VmHWM, RSS: s.VmRSS}
	// procfs reads a value it cannot parse as 0, and a kernel thread has
	// neither line; every process the bench watches has a resident set.
	if st.HWM == 0 || st.RSS == 0 {
		return memStatus{}, errors.New("no VmHWM and VmRSS sizes in kB (a kernel thread, or not Linux?)")
	}
	if st.HWM > maxSize || st.RSS > maxSize {
		return memStatus{}, fmt.Errorf("VmHWM %d or VmRSS %d bytes is not a resident set", st.HWM, st.RSS)
	}
	return st, nil
}

func readStatus(pid int) (memStatus, error) { return readStatusAt(procfs.DefaultMountPoint, pid) }

// clockTicks is USER_HZ, the unit of the times in /proc/<pid>/stat: 100 on
// every architecture Linux and Go share.
const clockTicks = 100

// procTimes is what the bench reads from /proc/<pid>/stat.
type procTimes struct {
	// CPU is the user and system CPU time.
	CPU time.Duration
	// System is the part of CPU spent in the kernel: system calls, and
	// the page faults and compaction of fresh memory, which a CPU profile
	// of the process shows only in part.
	System time.Duration
	// MinorFaults counts the page faults served without I/O: the first
	// write to a page of fresh memory is one, and not a cheap one
	// (docs/scale-log.md), so a phase's count shows what its allocations
	// cost besides the work.
	MinorFaults int64
}

// readStatAt reads the CPU time and minor faults from root's <pid>/stat.
func readStatAt(root string, pid int) (procTimes, error) {
	p, err := openProc(root, pid)
	if err != nil {
		return procTimes{}, err
	}
	st, err := p.Stat()
	if err != nil {
		return procTimes{}, err
	}
	tick := time.Second / clockTicks
	return procTimes{CPU: time.Duration(st.UTime+st.STime) * tick, System: time.Duration(st.STime) * tick, MinorFaults: int64(st.MinFlt)}, nil
}

func readStat(pid int) (procTimes, error) { return readStatAt(procfs.DefaultMountPoint, pid) }

func readCPU(pid int) (time.Duration, error) {
	t, err := readStat(pid)
	return t.CPU, err
}

// countFDs counts a process's open file descriptors.
func countFDs(pid int) (int, error) {
	p, err := openProc(procfs.DefaultMountPoint, pid)
	if err != nil {
		return 0, err
	}
	return p.FileDescriptorsLen()
}

// peak is what the sampler saw of one process.
type peak struct {
	fds, fdsAtBoundary int
	rss                uint64
	// hwmAtBoundary is the process's peak resident set when every rollout
	// was held: the dispatch's peak, before prepare and commit.
	hwmAtBoundary uint64
}

// sampler reads every tracked process's resident memory and descriptors
// every sampleEvery, keeps their peaks, and calls abort once when the
// total passes limit (0: no limit).
type sampler struct {
	limit uint64
	abort func(error)

	mu      sync.Mutex
	targets []target
	peaks   map[int]*peak // by pid; 0 is the bench itself
	total   uint64
	aborted bool

	stopCh chan struct{}
	done   chan struct{}
	once   sync.Once
}

func newSampler(limit uint64, abort func(error)) *sampler {
	s := &sampler{limit: limit, abort: abort, peaks: map[int]*peak{0: {}}, stopCh: make(chan struct{}), done: make(chan struct{})}
	go s.loop()
	return s
}

// track replaces the processes sampled (the bench itself is always sampled).
func (s *sampler) track(ts []target) {
	s.mu.Lock()
	s.targets = ts
	for _, t := range ts {
		if s.peaks[t.pid] == nil {
			s.peaks[t.pid] = &peak{}
		}
	}
	s.mu.Unlock()
	s.sample()
}

func (s *sampler) loop() {
	defer close(s.done)
	tick := time.NewTicker(sampleEvery)
	defer tick.Stop()
	for {
		select {
		case <-s.stopCh:
			return
		case <-tick.C:
			s.sample()
		}
	}
}

// sample reads every tracked process once. A process that is gone (killed
// by the bench) is skipped.
func (s *sampler) sample() {
	s.mu.Lock()
	pids := []int{0}
	for _, t := range s.targets {
		pids = append(pids, t.pid)
	}
	s.mu.Unlock()
	type reading struct {
		rss uint64
		fds int
		ok  bool
	}
	readings := make([]reading, len(pids))
	var total uint64
	for i, pid := range pids {
		st, err := readStatus(pid)
		if err != nil {
			continue
		}
		fds, err := countFDs(pid)
		if err != nil {
			continue
		}
		readings[i] = reading{rss: st.RSS, fds: fds, ok: true}
		total += st.RSS
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, pid := range pids {
		p := s.peaks[pid]
		if !readings[i].ok || p == nil {
			continue
		}
		p.rss = max(p.rss, readings[i].rss)
		p.fds = max(p.fds, readings[i].fds)
	}
	s.total = total
	if s.limit > 0 && total > s.limit && !s.aborted {
		s.aborted = true
		s.abort(fmt.Errorf("aborted: the fleet and the bench hold %s resident, over the limit of %s", mib(total), mib(s.limit)))
	}
}

// markBoundary samples now and records every process's descriptors as its
// count with all rollouts in flight.
func (s *sampler) markBoundary() {
	s.sample()
	s.mu.Lock()
	defer s.mu.Unlock()
	pids := []int{0}
	for _, t := range s.targets {
		pids = append(pids, t.pid)
	}
	for _, pid := range pids {
		p := s.peaks[pid]
		if p == nil {
			continue
		}
		if fds, err := countFDs(pid); err == nil {
			p.fdsAtBoundary = max(p.fdsAtBoundary, fds)
		}
		if st, err := readStatus(pid); err == nil {
			p.hwmAtBoundary = max(st.HWM, p.rss)
		}
	}
}

// totalRSS is the resident memory of the tracked processes and the bench at
// the last sample.
func (s *sampler) totalRSS() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

func (s *sampler) peakOf(pid int) peak {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.peaks[pid]; p != nil {
		return *p
	}
	return peak{}
}

func (s *sampler) stop() {
	s.once.Do(func() {
		close(s.stopCh)
		<-s.done
	})
}

// processStats reads each running fleet process's peak resident memory
// (VmHWM: the kernel's high-water mark) now. first labels the processes of
// the first fleet (read just before the kill); fakeinference, which
// survives the crash, is read with the fresh fleet at the end.
func (b *bench) processStats(fleetLabel string, first bool) []ProcessStat {
	var out []ProcessStat
	for _, t := range b.processes(fleetLabel) {
		if first && t.name == fakeName {
			continue
		}
		st, err := readStatus(t.pid)
		ps := ProcessStat{Name: t.name, Kind: b.kindOf(t.name), Fleet: t.fleet, PID: t.pid}
		if err != nil {
			ps.Error = err.Error()
		}
		if cpu, err := readCPU(t.pid); err == nil {
			ps.CPUSeconds = cpu.Seconds()
		}
		p := b.sampler.peakOf(t.pid)
		ps.PeakRSSBytes = max(st.HWM, p.rss)
		ps.PeakFDs = p.fds
		ps.FDsAtBoundary = p.fdsAtBoundary
		if t.fleet != "fresh" {
			ps.PeakRSSAtBoundaryBytes = p.hwmAtBoundary
		}
		if rt, ok := b.atBoundary[t.name]; ok && t.fleet != "fresh" {
			ps.StackBytesAtBoundary, ps.GoroutinesAtBoundary = rt.stackBytes, rt.goroutines
			ps.HeapBytesAtBoundary = rt.heapBytes
		}
		out = append(out, ps)
	}
	return out
}

// kindOf is the participant kind of a fleet process: its endpoints'.
func (b *bench) kindOf(process string) string {
	for _, p := range b.cfg.Processes {
		if p.Name == process && len(p.Endpoints) > 0 {
			return p.Endpoints[0].Kind
		}
	}
	return ""
}

// benchStats is the bench process's own peak memory and descriptors.
func benchStats(s *sampler) ProcessStat {
	ps := ProcessStat{Name: "bench", Fleet: "-", PID: os.Getpid()}
	st, err := readStatus(0)
	if err != nil {
		ps.Error = err.Error()
	}
	if cpu, err := readCPU(0); err == nil {
		ps.CPUSeconds = cpu.Seconds()
	}
	p := s.peakOf(0)
	ps.PeakRSSBytes = max(st.HWM, p.rss)
	ps.PeakFDs = p.fds
	ps.FDsAtBoundary = p.fdsAtBoundary
	return ps
}

// mib formats bytes as MiB (or GiB past 10 GiB).
func mib(n uint64) string {
	if n >= 10<<30 {
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20))
}

// summarizeLog counts the warning and error lines of a JSON log (slog's
// "level" field); other lines (the launcher's, a panic's) are not counted.
func summarizeLog(process string, r io.Reader) (LogSummary, error) {
	out := LogSummary{Process: process}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var counted bool
		switch {
		case bytes.Contains(line, []byte(`"level":"WARN"`)):
			out.Warnings++
			counted = true
		case bytes.Contains(line, []byte(`"level":"ERROR"`)):
			out.Errors++
			counted = true
		}
		if counted && out.First == "" {
			out.First = truncate(string(line), 400)
		}
	}
	return out, sc.Err()
}

// summarizeLogs reads every fleet process's log.
func (b *bench) summarizeLogs() {
	for _, name := range b.cfg.Names() {
		f, err := os.Open(b.cfg.LogPath(name))
		if err != nil {
			continue
		}
		sum, err := summarizeLog(name, f)
		f.Close()
		if err != nil {
			sum.First = "reading the log: " + err.Error()
		}
		b.res.Logs = append(b.res.Logs, sum)
	}
}

// DefaultMaxRSSBytes is the memory a run may hold before it aborts: 90% of
// this machine's (MemTotal in /proc/meminfo), leaving the kernel and page
// cache the rest rather than meeting the OOM killer; 20 GiB where
// /proc/meminfo cannot be read.
func DefaultMaxRSSBytes() uint64 {
	if total, ok := memTotalAt(procfs.DefaultMountPoint); ok {
		return total / 10 * 9
	}
	return 20 << 30
}

// memTotalAt reads MemTotal from root's meminfo, in bytes.
func memTotalAt(root string) (uint64, bool) {
	fs, err := procfs.NewFS(root)
	if err != nil {
		return 0, false
	}
	m, err := fs.Meminfo()
	if err != nil || m.MemTotalBytes == nil || *m.MemTotalBytes == 0 {
		return 0, false
	}
	return *m.MemTotalBytes, true
}
