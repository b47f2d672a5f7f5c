package ctlplanetest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// The participant benchmarks (each participant's checkpoint_bench_test.go)
// measure Export and Install the way the Controller runs them: Export
// through the real ckptstore writer into a directory (encoding, hashing,
// fsync and the manifest included), Install from the records ckptstore.Read
// verifies and returns. They share these helpers, so every kind is measured
// the same way.

// BenchSize is one scale a participant benchmark runs at.
type BenchSize struct {
	Name     string
	Episodes int
}

// BenchSizes are the scales of the participant benchmarks: 10k is cheap
// enough for make bench, 100k is the fleet's target scale.
func BenchSizes() []BenchSize { return []BenchSize{{"10k", 10_000}, {"100k", 100_000}} }

// ExportFunc is a participant's Export.
type ExportFunc func(ctx context.Context, scope ctlplane.Scope, emit func(ctlplane.Record) error) (ctlplane.Extras, error)

// InstallFunc is a participant's Install.
type InstallFunc func(ctx context.Context, records []ctlplane.Record, scope ctlplane.Scope, manifest ctlplane.Extras) ([]rollout.EpisodeID, error)

// WriteCheckpoint writes one checkpoint of scope as a commit does (the
// Controller's runWrite): export streams each record into the store's
// writer. It returns what was written.
func WriteCheckpoint(ctx context.Context, t ckptstore.Target, scope ctlplane.Scope, export ExportFunc) (ckptstore.Written, error) {
	if err := os.MkdirAll(t.Dir, 0o755); err != nil {
		return ckptstore.Written{}, err
	}
	store, err := ckptstore.Open(t.Dir)
	if err != nil {
		return ckptstore.Written{}, err
	}
	defer store.Close()
	return store.Write(ctx, t, &ckptstore.WriteStop{}, func(add func(ckptstore.Record) error) (map[string]any, error) {
		extras, err := export(ctx, scope, add)
		return extras.Manifest, err
	})
}

// BenchExport measures export: each op writes one checkpoint of scope into
// a fresh directory. want is the number of records the export must hold.
// It reports records/s, the records file's bytes per op, (through
// SetBytes) MB/s and the process's CPU time per op (cpu-ms/op).
func BenchExport(b *testing.B, kind, instance string, scope ctlplane.Scope, want int, export ExportFunc) {
	b.ReportAllocs()
	ctx := context.Background()
	root := b.TempDir()
	var written ckptstore.Written
	cpu := cpuClock{b: b}
	runtime.GC()
	i := 0
	for b.Loop() {
		i++
		t := ckptstore.Target{Dir: root, Kind: kind, Instance: instance, CheckpointID: fmt.Sprintf("bench-%d", i)}
		cpu.resume()
		var err error
		if written, err = WriteCheckpoint(ctx, t, scope, export); err != nil {
			b.Fatal(err)
		}
		cpu.pause()
		b.StopTimer()
		if written.Manifest.RecordCount != want {
			b.Fatalf("exported %d records, want %d", written.Manifest.RecordCount, want)
		}
		// Each op writes a new directory; drop the last one so a run at
		// 100k does not fill the disk.
		if err := os.RemoveAll(t.ParticipantDir()); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(written.Bytes)
		// Garbage of the setup or of the last op is collected here rather
		// than inside the next timed op.
		runtime.GC()
		b.StartTimer()
	}
	reportRate(b, written.Manifest.RecordCount, written.Bytes, "bytes-written/op")
	cpu.report()
}

// BenchInstall measures restore: each op reads target's records back with
// ckptstore.Read (the whole file is hashed and counted) and installs those
// scope names into a fresh participant. fresh builds the participant
// outside the timer and returns its Install and a function that frees it;
// the controller closes admission before it installs, and so must fresh.
// want is the number of episodes Install must return. It reports what
// BenchExport does, for the bytes read.
func BenchInstall(b *testing.B, target ckptstore.Target, scope ctlplane.Scope, want int, fresh func() (InstallFunc, func())) {
	b.ReportAllocs()
	ctx := context.Background()
	store, err := ckptstore.Open(target.Dir)
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	var records int
	var size int64
	cpu := cpuClock{b: b}
	for b.Loop() {
		b.StopTimer()
		install, free := fresh()
		// The previous op's participant is garbage now; collect it here
		// rather than inside the next timed op.
		runtime.GC()
		b.StartTimer()
		cpu.resume()
		m, recs, n, err := store.Read(ctx, target, scope.Has)
		if err != nil {
			b.Fatal(err)
		}
		installed, err := install(ctx, recs, scope, ctlplane.Extras{Manifest: m.Extras})
		if err != nil {
			b.Fatal(err)
		}
		cpu.pause()
		b.StopTimer()
		if len(installed) != want {
			b.Fatalf("installed %d episodes, want %d", len(installed), want)
		}
		records, size = len(recs), n
		b.SetBytes(n)
		free()
		b.StartTimer()
	}
	reportRate(b, records, size, "bytes-read/op")
	cpu.report()
}

func reportRate(b *testing.B, records int, size int64, sizeUnit string) {
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(records)*float64(b.N)/s, "records/s")
	}
	b.ReportMetric(float64(size), sizeUnit)
}

// cpuClock measures the CPU time the process spends (every thread: the
// garbage collector's included) while the benchmark's timer runs. On a
// machine shared with other work it is steadier than the wall time, and it
// is what the fleet's budget (2 cores for every server) is spent in.
type cpuClock struct {
	b     *testing.B
	total time.Duration
	start time.Duration
}

func (c *cpuClock) resume() { c.start = processCPU() }
func (c *cpuClock) pause()  { c.total += processCPU() - c.start }

func (c *cpuClock) report() {
	if c.b.N > 0 {
		c.b.ReportMetric(float64(c.total.Milliseconds())/float64(c.b.N), "cpu-ms/op")
	}
}

// EpisodeIDs names n attempt-0 episodes rollout-000000, rollout-000001, ...
// (the order is the capture key order).
func EpisodeIDs(n int) []rollout.EpisodeID {
	ids := make([]rollout.EpisodeID, n)
	for i := range ids {
		ids[i] = rollout.EpisodeID{RolloutID: fmt.Sprintf("rollout-%06d", i)}
	}
	return ids
}

// BenchTarget names a checkpoint of one participant in a fresh directory.
func BenchTarget(tb testing.TB, kind, instance string) ckptstore.Target {
	return ckptstore.Target{Dir: tb.TempDir(), Kind: kind, Instance: instance, CheckpointID: "bench"}
}

// HandlerClient is an HTTP client whose requests h serves in process, with
// no listener: benchmarks build state at scale through servers' real routes
// without paying for connections.
func HandlerClient(h http.Handler) *http.Client { return &http.Client{Transport: handlerTransport{h}} }

type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body == nil {
		r = r.Clone(r.Context())
		r.Body = http.NoBody
	}
	w := httptest.NewRecorder()
	t.h.ServeHTTP(w, r)
	resp := w.Result()
	resp.Request = r
	return resp, nil
}

// BenchOwn registers close to run when the benchmark ends, unless the
// returned release runs it first; after release nothing the benchmark holds
// keeps what close frees reachable. A benchmark of Install builds a fresh
// participant for every op and the source of the checkpoint before them: a
// cleanup that held them all would keep 100,000 episodes per op alive, and
// the garbage collector would pay for every one of them in every op.
func BenchOwn(tb testing.TB, close func()) (release func()) {
	o := &owned{close: close}
	tb.Cleanup(o.release)
	return o.release
}

type owned struct {
	mu    sync.Mutex
	close func()
}

func (o *owned) release() {
	o.mu.Lock()
	c := o.close
	o.close = nil
	o.mu.Unlock()
	if c != nil {
		c()
	}
}
