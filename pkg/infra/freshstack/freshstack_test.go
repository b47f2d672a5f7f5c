package freshstack

import (
	"errors"
	"runtime"
	"runtime/metrics"
	"sync"
	"testing"
)

func TestCall_ReturnsWhatFnReturns(t *testing.T) {
	want := errors.New("boom")
	v, err := Call(func() (int, error) { return 7, want })
	if v != 7 || !errors.Is(err, want) {
		t.Fatalf("Call = %d, %v; want 7, %v", v, err, want)
	}
}

func TestRun_RunsFnBeforeReturning(t *testing.T) {
	ran := false
	Run(func() { ran = true })
	if !ran {
		t.Fatal("Run returned before fn ran")
	}
}

func TestRun_RaisesFnsPanicInTheCaller(t *testing.T) {
	cause := errors.New("bad input")
	defer func() {
		p, ok := recover().(*Panic)
		if !ok {
			t.Fatalf("recovered %T, want *Panic", p)
		}
		if !errors.Is(p, cause) || p.Value != cause {
			t.Fatalf("panic value %v, want %v", p.Value, cause)
		}
		if len(p.Stack) == 0 {
			t.Fatal("the panic carries no stack of fn")
		}
	}()
	Run(func() { panic(cause) })
	t.Fatal("Run returned after fn panicked")
}

func TestRun_ReportsAGoexitAsAPanicWithoutValue(t *testing.T) {
	defer func() {
		p, ok := recover().(*Panic)
		if !ok || p.Value != nil {
			t.Fatalf("recovered %#v, want a *Panic with no value", p)
		}
	}()
	Run(runtime.Goexit)
	t.Fatal("Run returned after fn exited its goroutine")
}

// deep needs about 16 KB of stack below its caller.
//
//go:noinline
func deep(n int) byte {
	var pad [1000]byte
	pad[n%len(pad)] = byte(n)
	if n == 0 {
		return pad[0]
	}
	return deep(n-1) + pad[n%len(pad)]
}

// parkAt(6) parks with about 4 KB of frames on the stack (more than a quarter
// of 16 KB, so a collection does not shrink a stack grown to 16 KB), after
// calling work at that depth.
//
//go:noinline
func parkAt(depth int, work func(), parked *sync.WaitGroup, release chan struct{}) byte {
	var pad [600]byte
	pad[depth] = byte(depth)
	if depth > 0 {
		return parkAt(depth-1, work, parked, release) + pad[(depth*7)%len(pad)]
	}
	work()
	parked.Done()
	<-release
	return pad[0]
}

// stackBytes is the memory of every goroutine stack, after collections that
// shrink what can be shrunk.
func stackBytes() uint64 {
	runtime.GC()
	runtime.GC()
	s := []metrics.Sample{{Name: "/memory/classes/heap/stacks:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// perParked is the stack memory each of n goroutines holds while parked at
// the same depth after work.
func perParked(n int, work func()) uint64 {
	before := stackBytes()
	var parked, exited sync.WaitGroup
	release := make(chan struct{})
	parked.Add(n)
	for range n {
		exited.Go(func() { parkAt(6, work, &parked, release) })
	}
	parked.Wait()
	held := stackBytes()
	close(release)
	exited.Wait()
	if held < before {
		return 0
	}
	return (held - before) / uint64(n)
}

func TestRun_KeepsTheCallersStackSmallWhileItParks(t *testing.T) {
	const n = 2000
	idle := perParked(n, func() {})
	direct := perParked(n, func() { deep(16) })
	fresh := perParked(n, func() { Run(func() { deep(16) }) })
	t.Logf("stack per parked goroutine: %d bytes with no work, %d after deep work on its own stack, %d through Run", idle, direct, fresh)
	// Without the race detector: 8 KB, 16 KB, 8 KB (its instrumentation
	// widens every frame, and the sizes double). Other goroutines' stacks
	// freed between the readings blur each by a few hundred bytes.
	if 2*direct < 3*idle {
		t.Fatalf("deep work on the parked goroutine's own stack left %d bytes per goroutine, against %d with no work; the test expects it to keep a grown stack", direct, idle)
	}
	if 4*fresh > 5*idle {
		t.Fatalf("through Run a parked goroutine holds %d bytes of stack, against %d with no work (and %d with the work on its own stack)", fresh, idle, direct)
	}
}

// BenchmarkRun is the cost Run adds to a call: a goroutine's start, its
// stack, and two switches.
func BenchmarkRun(b *testing.B) {
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			deep(0)
		}
	})
	b.Run("fresh", func(b *testing.B) {
		for b.Loop() {
			Run(func() { deep(0) })
		}
	})
	b.Run("fresh-growing-to-16KB", func(b *testing.B) {
		for b.Loop() {
			Run(func() { deep(8) })
		}
	})
}
