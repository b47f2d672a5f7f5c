package environment_test

import (
	"bytes"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/servers/environment"
)

// parkedAtCPUGate counts the goroutines waiting in the CPU gate's enter,
// from a dump of every goroutine's stack: a /run waiting for a slot has no
// other observable sign.
func parkedAtCPUGate() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	parked := 0
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("/pkg/servers/environment.cpuGate.enter(")) {
			parked++
		}
	}
	return parked
}

// TestRun_GoesThroughTheCPUGate: the CPU gate bounds the start of a /run,
// the decoding of its body (and, with checkpointing on, the digest of its
// task), not the episode: a /run waits for a slot before it does anything
// upstream, and frees the slot before its first upstream call, so the
// episodes in their upstream calls at once are not bounded by the gate and
// hold none of its slots.
//
// The test takes every slot itself, so the gate is full, and sends one /run
// more than the gate admits. All of them wait at the gate and no upstream
// sees a call. Then it frees one slot and keeps the others: every /run gets
// through that one slot, one after the other, and all of them are held in
// their first upstream call (the resources server's seed) at once, with the
// gate's only taken slots the test's own.
func TestRun_GoesThroughTheCPUGate(t *testing.T) {
	hold := make(chan struct{})
	seeded := make(chan string, 1024)
	f := newFixture(t, environment.ProtocolSingleAgentTurn, func(_, res map[string]route) {
		res["/seed_session"] = func(w http.ResponseWriter, r *http.Request, body []byte) {
			seeded <- r.URL.Path
			select {
			case <-hold:
			case <-r.Context().Done():
				return
			}
			jsonReply(200, `{}`)(w, r, body)
		}
	})
	// The stand-ins send every call to the recorder's buffered channel;
	// drain it so that many episodes cannot fill it.
	stopDrain := make(chan struct{})
	go func() {
		for {
			select {
			case <-f.rec.seen:
			case <-stopDrain:
				return
			}
		}
	}()
	var unholdOnce sync.Once
	unhold := func() { unholdOnce.Do(func() { close(hold) }) }
	// Cleanups run last first: the episodes and the gate are released
	// before the servers close.
	t.Cleanup(func() { close(stopDrain) })
	t.Cleanup(unhold)

	slots := environment.CPUGateSlots(f.env)
	if slots < 1 {
		t.Fatalf("the gate admits %d handlers", slots)
	}
	leaves := make([]func(), slots)
	for i := range leaves {
		leaves[i] = environment.TakeCPUGateSlot(f.env)
	}
	var leaveMu sync.Mutex
	leave := func(i int) {
		leaveMu.Lock()
		defer leaveMu.Unlock()
		if leaves[i] != nil {
			leaves[i]()
			leaves[i] = nil
		}
	}
	t.Cleanup(func() {
		for i := range leaves {
			leave(i)
		}
	})

	type result struct {
		status int
		body   string
		err    error
	}
	n := slots + 1
	results := make(chan result, n)
	for i := range n {
		body := strings.Replace(row, `"_ng_rollout_index":0`, fmt.Sprintf(`"_ng_rollout_index":%d`, i), 1)
		go func() {
			s, b, err := postRun(t.Context(), t, f.url, body)
			results <- result{s, b, err}
		}()
	}

	// The gate is full: every /run waits at it, and none gets upstream.
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for parked := 0; parked != n; parked = parkedAtCPUGate() {
		select {
		case p := <-seeded:
			t.Fatalf("%s was called while the gate was full", p)
		case r := <-results:
			t.Fatalf("a /run ended while the gate was full: %d %s, %v", r.status, r.body, r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out with %d of %d /run waiting at the full gate", parked, n)
		}
		<-tick.C
	}
	if live := f.env.Live(); len(live) != 0 {
		t.Fatalf("episodes started while the gate was full: %+v", live)
	}

	// One slot frees; every /run gets through it and reaches its seed,
	// where all are held at once: none keeps a slot past its start.
	leave(0)
	timeout := time.After(10 * time.Second)
	for i := range n {
		select {
		case <-seeded:
		case r := <-results:
			t.Fatalf("a /run ended before its seed was released: %d %s, %v", r.status, r.body, r.err)
		case <-timeout:
			t.Fatalf("%d of %d episodes reached their seed through one free slot of the gate; the others wait at the gate (%d) or hold a slot through their upstream calls",
				i, n, parkedAtCPUGate())
		}
	}
	if taken := environment.CPUGateTaken(f.env); taken != slots-1 {
		t.Errorf("%d gate slots taken while %d episodes wait upstream, want the test's %d", taken, n, slots-1)
	}
	if live := f.env.Live(); len(live) != n {
		t.Errorf("%d episodes live, want %d", len(live), n)
	}

	unhold()
	for range n {
		if r := <-results; r.err != nil || r.status != http.StatusOK {
			t.Errorf("/run = %d %s, %v", r.status, r.body, r.err)
		}
	}
}
