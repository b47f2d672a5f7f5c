package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// The multi-host test (issue 35): one fleet spread over network namespaces
// joined by a bridge (see hostNet), each namespace a host with an address of its own. The
// processes of one host, or of every host, are killed with SIGKILL after a
// checkpoint into a directory every host sees, and fresh processes restore
// it on hosts other than the ones the state came from. fakeinference is the
// inference node, a host of its own that never dies.
//
// Making namespaces takes root. `make test-hosts` sets GYMFLEET_E2E_HOSTS=
// required, which turns the skip without root into a failure.

// fleetHosts are the hosts the fleet's servers run on.
var fleetHosts = []string{"a", "b", "c"}

// infHost is fakeinference's host.
const infHost = "inf"

// hostNet is a set of network namespaces, each with a veth into one bridge.
// The bridge lives in a namespace of its own, the switch, with no firewall
// rules: a root namespace whose bridged traffic goes through iptables with
// a forward policy of DROP (as Docker sets it) would cut the hosts off from
// each other. The root namespace has a veth into the switch and an address
// of its own, through which the test's clients and the launcher's probes
// reach every host.
type hostNet struct {
	prefix string            // the namespaces' and veths' names begin with it
	ns     map[string]string // host -> namespace name
	addr   map[string]string // host -> its address
}

// switchHost names the switch's namespace (never a host's).
const switchHost = "sw"

// newHostNet makes one namespace per host and registers the removal of all
// of them, the switch and their veths (and the processes left in them) for
// the end of the test, passed or failed.
func newHostNet(t *testing.T, hosts []string) *hostNet {
	t.Helper()
	pid := os.Getpid()
	// A /24 of its own per test process, so two runs side by side never
	// share addresses.
	subnet := fmt.Sprintf("10.%d.%d", 200+(pid>>8)%50, pid&0xff)
	h := &hostNet{prefix: fmt.Sprintf("gf%d", pid), ns: map[string]string{}, addr: map[string]string{}}
	removeStaleHostNets(t)
	var made []string
	t.Cleanup(func() {
		for _, ns := range made {
			killNetnsPIDs(ns)
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				t.Errorf("deleting namespace %s: %v %s", ns, err, out)
			}
		}
		// Gone with its peer in the switch; a failed set-up may have left
		// it behind.
		_ = exec.Command("ip", "link", "del", h.prefix+"r").Run()
	})
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v %s", strings.Join(args, " "), err, out)
		}
	}
	sw := h.prefix + "-" + switchHost
	ip("netns", "add", sw)
	made = append(made, sw)
	ip("-n", sw, "link", "add", "br0", "type", "bridge")
	ip("-n", sw, "link", "set", "br0", "up")
	// port links the namespace ns (the root one when empty) to the switch
	// with the address addr.
	port := func(ns, veth, addr string) {
		ip("link", "add", veth, "netns", sw, "type", "veth", "peer", "name", veth+"p")
		ip("-n", sw, "link", "set", veth, "master", "br0")
		ip("-n", sw, "link", "set", veth, "up")
		in := []string{}
		if ns != "" {
			ip("link", "set", veth+"p", "netns", ns)
			in = []string{"-n", ns}
			ip(append(in, "link", "set", "lo", "up")...)
		}
		ip(append(in, "addr", "add", addr+"/24", "dev", veth+"p")...)
		ip(append(in, "link", "set", veth+"p", "up")...)
	}
	for i, host := range hosts {
		ns := h.prefix + "-" + host
		h.ns[host] = ns
		h.addr[host] = fmt.Sprintf("%s.%d", subnet, i+1)
		ip("netns", "add", ns)
		made = append(made, ns)
		port(ns, h.prefix+host, h.addr[host])
	}
	port("", h.prefix+"r", subnet+".254")
	return h
}

// staleNS is a namespace of this test's, its creator's pid the first group.
var staleNS = regexp.MustCompile(`^gf([0-9]+)-[a-z]+$`)

// removeStaleHostNets removes the namespaces, veths and bridges of earlier
// runs whose test process is gone: a run killed by go test's timeout never
// runs its cleanups.
func removeStaleHostNets(t *testing.T) {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatalf("ip netns list: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		m := staleNS.FindStringSubmatch(fields[0])
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		if err := syscall.Kill(pid, 0); err == nil || !errors.Is(err, syscall.ESRCH) {
			continue // its test still runs
		}
		ns := fields[0]
		killNetnsPIDs(ns)
		t.Logf("removing namespace %s of a run that is gone", ns)
		_ = exec.Command("ip", "netns", "del", ns).Run()
		_ = exec.Command("ip", "link", "del", "gf"+m[1]+"r").Run()
	}
}

// killNetnsPIDs kills whatever still runs in a namespace: a namespace with
// processes outlives its name.
func killNetnsPIDs(ns string) {
	out, err := exec.Command("ip", "netns", "pids", ns).Output()
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(out)) {
		if p, err := strconv.Atoi(f); err == nil {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	}
}

// netnsOf is the inode of a process's network namespace.
func netnsOf(t *testing.T, pid int) string {
	t.Helper()
	l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// hostOfPID names the host whose namespace process pid runs in.
func (h *hostNet) hostOfPID(t *testing.T, pid int) string {
	t.Helper()
	got := netnsOf(t, pid)
	for host, ns := range h.ns {
		var st syscall.Stat_t
		if err := syscall.Stat("/run/netns/"+ns, &st); err != nil {
			t.Fatal(err)
		}
		if got == fmt.Sprintf("net:[%d]", st.Ino) {
			return host
		}
	}
	t.Fatalf("process %d runs in %s, none of the test's hosts", pid, got)
	return ""
}

// portRun hands out the same ports every time: each host has a port
// space of its own, and a fleet regenerated for other hosts keeps
// fakeinference (which does not move) at its address.
type portRun int

func (p portRun) Take(n int) ([]int, error) {
	out := make([]int, n)
	for i := range out {
		out[i] = int(p) + i
	}
	return out, nil
}

// placement maps each process of the fleet to its host.
type placement map[string]string

// startHostsFleet generates the standard fleet with every process on its
// placement's host (a directory of its own per placement: the hosts share
// only the checkpoint root), and starts its processes (fakeinference only
// when withInference).
func startHostsFleet(t *testing.T, h *hostNet, place placement, dir, ckptRoot string, withInference bool) *Fleet {
	t.Helper()
	topo := fleet.Standard(dir, binDir, token)
	topo.LogLevel = "debug"
	topo.HTTPStack = stack
	topo.Ports = portRun(18000)
	topo.CheckpointRoot = ckptRoot
	topo.Hosts = map[string]string{}
	for proc, host := range place {
		topo.Hosts[proc] = h.addr[host]
	}
	cfg, err := fleet.Generate(topo)
	if err != nil {
		t.Fatal(err)
	}
	// Each process runs in its host's namespace: its binary is a script
	// that enters the namespace and execs the server in place, so the
	// launcher's pid and process group are the server's.
	for i, p := range cfg.Processes {
		host, ok := place[p.Name]
		if !ok {
			t.Fatalf("the placement has no host for %s", p.Name)
		}
		wrapper := filepath.Join(dir, "on-"+host+"-"+p.Binary)
		script := fmt.Sprintf("#!/bin/sh\nexec ip netns exec %s %s \"$@\"\n", h.ns[host], filepath.Join(binDir, p.Binary))
		if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		cfg.Processes[i].Binary = wrapper
	}
	hc := cfg.HTTP.Conf(cfg.BaseDir)
	hc.TLS = httpconf.TLS{}
	f := &Fleet{
		t: t, topo: topo, Cfg: cfg,
		L:       fleet.NewLauncher(cfg, fleet.Options{StopGrace: 5 * time.Second}),
		client:  httpclient.New(httpclient.Options{H2C: true, HTTP: hc}),
		ctl:     httpclient.New(httpclient.Options{H2C: true, HTTP: hc}),
		CkptDir: filepath.Join(ckptRoot, "checkpoints"),
	}
	fake, _ := cfg.Endpoint("fakeinference")
	f.Fake = fakes{fakeinference.NewControl(fake.URL, f.ctl)}
	env, _ := cfg.Endpoint("env")
	f.EnvURL = env.URL
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range cfg.Names() {
				if logs := f.L.Logs(name); logs != "" {
					t.Logf("--- log of %s on host %s ---\n%s", name, place[name], logs)
				}
			}
		}
		_ = f.L.KillAll()
		f.client.CloseIdleConnections()
		f.ctl.CloseIdleConnections()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, name := range cfg.Names() {
		if name == "fakeinference" && !withInference {
			continue
		}
		if err := f.L.Start(ctx, name); err != nil {
			t.Fatal(err)
		}
		if got := h.hostOfPID(t, f.L.PID(name)); got != place[name] {
			t.Fatalf("%s runs on host %s, want %s", name, got, place[name])
		}
	}
	return f
}

func TestHosts(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("GYMFLEET_E2E_HOSTS") == "required" {
			t.Fatal("the multi-host test needs root to make network namespaces (GYMFLEET_E2E_HOSTS=required)")
		}
		t.Skip("the multi-host test needs root to make network namespaces")
	}
	h := newHostNet(t, append([]string{infHost}, fleetHosts...))
	// Where the state is made, and where it is restored: every process on a
	// host other than its first.
	first := placement{"fakeinference": infHost, "policy_model": "a", "resources": "b", "agents": "b", "env": "c"}
	second := placement{"fakeinference": infHost, "policy_model": "b", "resources": "c", "agents": "c", "env": "a"}
	for proc, host := range first {
		if proc != "fakeinference" && second[proc] == host {
			t.Fatalf("%s is restored on the host it ran on", proc)
		}
	}
	for _, dies := range [][]string{{"a"}, {"b"}, {"c"}, fleetHosts} {
		name := "Host_" + strings.Join(dies, "")
		if len(dies) == len(fleetHosts) {
			name = "AllHosts"
		}
		t.Run(name, func(t *testing.T) { hostsCrashAndMove(t, h, first, second, dies) })
	}
}

// hostsCrashAndMove checkpoints a weather and a counter rollout, each with
// its second model call held (undelivered), kills every process of the
// hosts in dies, then the rest of the fleet, restores on the second
// placement's hosts, and requires each rollout to finish once with reward
// 1 and no delivered model call repeated.
func hostsCrashAndMove(t *testing.T, h *hostNet, first, second placement, dies []string) {
	dir := t.TempDir()
	ckptRoot := filepath.Join(dir, "shared")
	f := startHostsFleet(t, h, first, filepath.Join(dir, "first"), ckptRoot, true)
	f.HoldSecondCalls()
	weather := weatherRow("hosts-w", "weather_agent", "Paris")
	counter := counterRow("hosts-c", "counter_agent", 3, 1, 2)
	scope := []rollout.EpisodeID{ep("hosts-w", 0), ep("hosts-c", 0)}
	firsts := []*Run{f.Start(weather), f.Start(counter)}
	f.WaitHeld("hosts-w", 2)
	f.WaitHeld("hosts-c", 2)
	f.Checkpoint(f.Coord(), "c1", scope...)

	// Every process of the dying hosts at once, as a host crash would;
	// the other hosts' processes are still running then.
	var survivors []string
	for _, name := range f.Cfg.Names() {
		if slices.Contains(dies, first[name]) {
			if err := f.L.Kill(name); err != nil {
				t.Fatal(err)
			}
		} else {
			survivors = append(survivors, name)
		}
	}
	for _, name := range survivors {
		if !f.L.Running(name) {
			t.Fatalf("%s on host %s died with hosts %v", name, first[name], dies)
		}
	}
	// The fleet restores into fresh processes: the rest of it goes too
	// (fakeinference, the inference node, survives).
	for _, name := range survivors {
		if name != "fakeinference" {
			if err := f.L.Kill(name); err != nil {
				t.Fatal(err)
			}
		}
	}
	f.client.CloseIdleConnections()
	f.ctl.CloseIdleConnections()

	g := startHostsFleet(t, h, second, filepath.Join(dir, "second"), ckptRoot, false)
	c := g.Coord()
	if _, err := c.Restore(context.Background(), "c1", f.Dir("c1"), scope, deadline(30*time.Second)); err != nil {
		t.Fatalf("restore c1 on other hosts: %v", err)
	}
	g.Resume(c, "c1")
	g.Release()
	for _, r := range firsts {
		if rep := r.Wait(t, 30*time.Second); rep.Status == http.StatusOK {
			t.Fatalf("the first attempt of %v replied across the crash: %v", r.Row[rollout.FieldRolloutID], rep.Body)
		}
	}
	assertReward(t, g.RunOK(withAttempt(weather, 1)), 1.0)
	assertReward(t, g.RunOK(withAttempt(counter, 1)), 1.0)
	// The delivered calls are never repeated; the undelivered second call
	// is re-issued once.
	if got, want := g.MessageCounts("hosts-w"), []int{2, 4, 4}; !slices.Equal(got, want) {
		t.Fatalf("weather model calls (messages each) %v, want %v", got, want)
	}
	if got, want := g.MessageCounts("hosts-c"), []int{2, 4, 4, 6}; !slices.Equal(got, want) {
		t.Fatalf("counter model calls (messages each) %v, want %v", got, want)
	}
	// The replacement's ledger continues the source's lineage.
	rows := g.ledger("hosts-c-a1")
	if len(rows) != 3 || rows[1]["parent_call_id"] != rows[0]["call_id"] || rows[2]["parent_call_id"] != rows[1]["call_id"] {
		t.Fatalf("the replacement's ledger is not call 0 imported then two new calls in lineage: %v", rows)
	}
}
