//go:build linux

package hugepage

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"
)

func TestMakeBuffer_AdvisesHugePages(t *testing.T) {
	n := 8*Size + 123
	buf := MakeBuffer(n)
	if len(buf) != n {
		t.Fatalf("len %d, want %d", len(buf), n)
	}
	checkAdvised(t, "the buffer's aligned interior", alignedInterior(buf))
	for i := range buf {
		if buf[i] != 0 {
			t.Fatalf("byte %d is %d, want a zeroed buffer", i, buf[i])
		}
		buf[i] = byte(i)
	}
}

// MakePages: whole huge pages from a huge page boundary, all advised, even
// for a buffer of one page or less.
func TestMakePages(t *testing.T) {
	for _, n := range []int{1, Size, 3*Size + 5} {
		buf := MakePages(n)
		start := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
		if len(buf) != n || cap(buf)%Size != 0 || cap(buf) < n || cap(buf)-n >= Size || start%Size != 0 {
			t.Fatalf("MakePages(%d): len %d, cap %d, at %#x; want len %d, whole huge pages from a huge page boundary", n, len(buf), cap(buf), start, n)
		}
		whole := buf[:cap(buf)]
		checkAdvised(t, fmt.Sprintf("MakePages(%d)'s first byte", n), start)
		checkAdvised(t, fmt.Sprintf("MakePages(%d)'s last byte", n), start+uintptr(cap(buf))-1)
		for i := range whole {
			if whole[i] != 0 {
				t.Fatalf("MakePages(%d): byte %d is %d, want a zeroed buffer", n, i, whole[i])
			}
		}
	}
}

// checkAdvised fails unless the mapping holding addr is advised as huge
// pages. A kernel built without THP refuses MADV_HUGEPAGE, so there the
// memory is plain and there is no advice to check: the buffer's other
// properties still are.
func checkAdvised(t *testing.T, what string, addr uintptr) {
	t.Helper()
	if thpMode() == "" {
		t.Logf("%s: not checked for huge page advice, this kernel has no transparent huge pages (no /sys/kernel/mm/transparent_hugepage)", what)
		return
	}
	if flags := flagsAt(t, addr); !hasFlag(flags, "hg") {
		t.Errorf("the mapping holding %s (%#x) has VmFlags %q, want hg (huge pages advised)", what, addr, flags)
	}
}

func TestMakeBuffer_SmallBuffersArePlain(t *testing.T) {
	for _, n := range []int{0, 1, Size, 2*Size - 1} {
		buf := MakeBuffer(n)
		if len(buf) != n {
			t.Fatalf("MakeBuffer(%d): len %d", n, len(buf))
		}
		clear(buf)
	}
}

// TestPrepareHeap_LaterAllocationsGetHugePages checks what a restore relies
// on, in a fresh process as a restore's is: the allocations after
// PrepareHeap are backed by huge pages, where without it they are not, and
// preparing does not fault the memory in.
func TestPrepareHeap_LaterAllocationsGetHugePages(t *testing.T) {
	if thpMode() != "madvise" {
		t.Skipf("THP mode is %q: advice changes nothing, and PrepareHeap does nothing (TestPrepareHeap_DoesNothingForLittle still runs)", thpMode())
	}
	prepared := allocateInFreshProcess(t, true)
	plain := allocateInFreshProcess(t, false)
	const mb = 1 << 20
	t.Logf("huge pages back %d MB with PrepareHeap, %d MB without; %d MB of what was prepared was resident before use", prepared.huge/mb, plain.huge/mb, prepared.preparedResident/mb)
	if prepared.huge < 32*mb {
		t.Errorf("after PrepareHeap, %d MB of the %d MB allocated are on huge pages, want at least 32", prepared.huge/mb, freshAllocation/mb)
	}
	if plain.huge > 8*mb {
		t.Errorf("without PrepareHeap, %d MB of the allocations are on huge pages: the check cannot tell PrepareHeap's effect", plain.huge/mb)
	}
	if hasFlag(prepared.releasedFlags, "hg") || !hasFlag(prepared.releasedFlags, "nh") {
		t.Errorf("after Release the prepared span has VmFlags %q, want nh and no hg (advice withdrawn)", prepared.releasedFlags)
	}
	if prepared.preparedResident > 16*mb {
		t.Errorf("%d MB of the %d MB PrepareHeap advised are resident: the pages were touched", prepared.preparedResident/mb, freshPrepared/mb)
	}
}

// The fresh process's figures, in bytes.
const (
	freshPrepared   = 128 << 20
	freshAllocation = 64 << 20
)

type freshFigures struct {
	// huge is how much more memory huge pages back after the allocations.
	huge int64
	// preparedResident is how much of what PrepareHeap advised is resident.
	preparedResident int64
	// releasedFlags are the VmFlags of the prepared span after Release.
	releasedFlags string
}

// allocateInFreshProcess runs freshProcess in a new process of this test
// binary and returns what it measured.
func allocateInFreshProcess(t *testing.T, prepare bool) freshFigures {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), freshProcessEnv+"="+strconv.FormatBool(prepare))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("fresh process: %v\n%s", err, out)
	}
	var f freshFigures
	for _, line := range strings.Split(string(out), "\n") {
		if _, err := fmt.Sscanf(line, "figures %d %d %q", &f.huge, &f.preparedResident, &f.releasedFlags); err == nil {
			return f
		}
	}
	t.Fatalf("fresh process printed no figures:\n%s", out)
	return f
}

// TestMain runs this test binary as the fresh process of
// TestPrepareHeap_LaterAllocationsGetHugePages when asked to.
func TestMain(m *testing.M) {
	if mode := os.Getenv(freshProcessEnv); mode != "" {
		if err := freshProcess(mode == "true"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const freshProcessEnv = "HUGEPAGE_FRESH_PROCESS"

// freshProcess prepares the heap or not, allocates as an install does
// (small objects, then a large buffer) and writes every byte, then prints
// how much more memory huge pages back.
func freshProcess(prepare bool) error {
	hugeBefore, err := hugeBytes()
	if err != nil {
		return err
	}
	var preparedResident int64
	var prepared Prepared
	if prepare {
		prepared = PrepareHeap(freshPrepared)
		if got := prepared.Bytes(); got < freshPrepared-Size {
			return fmt.Errorf("PrepareHeap(%d) advised %d bytes, want all but the unaligned ends", freshPrepared, got)
		}
		// The span is free heap, still mapped: its pages must not have
		// been touched. (The process's resident memory would not tell: the
		// race detector writes shadow memory for every allocation.)
		resident, err := residentPages(prepared.start, prepared.end)
		if err != nil {
			return err
		}
		preparedResident = resident * int64(os.Getpagesize())
	}
	small := make([]*[64]byte, 0, freshAllocation/2/64)
	for range cap(small) {
		p := new([64]byte)
		p[0] = 1
		small = append(small, p)
	}
	large := make([]byte, freshAllocation/2)
	for i := range large {
		large[i] = byte(i)
	}
	hugeAfter, err := hugeBytes()
	if err != nil {
		return err
	}
	released := "none"
	if prepare {
		prepared.Release()
		if released, err = flagsOf(prepared.start); err != nil {
			return err
		}
	}
	fmt.Printf("figures %d %d %q\n", hugeAfter-hugeBefore, preparedResident, released)
	runtime.KeepAlive(small)
	runtime.KeepAlive(large)
	return nil
}

func TestPrepareHeap_DoesNothingForLittle(t *testing.T) {
	if got := PrepareHeap(2*Size - 1).Bytes(); got != 0 {
		t.Errorf("PrepareHeap of under two huge pages advised %d bytes, want 0", got)
	}
}

func TestSelectedMode(t *testing.T) {
	for setting, want := range map[string]string{
		"always [madvise] never\n": "madvise",
		"[always] madvise never\n": "always",
		"always madvise [never]\n": "never",
		"always madvise never\n":   "",
		"[always madvise never\n":  "",
		"":                         "",
	} {
		if got := selectedMode(setting); got != want {
			t.Errorf("selectedMode(%q) = %q, want %q", setting, got, want)
		}
	}
}

// alignedInterior is the first 2 MiB boundary inside buf, which must hold
// one.
func alignedInterior(buf []byte) uintptr { return interior(buf).start }

func hasFlag(flags, flag string) bool { return strings.Contains(" "+flags+" ", " "+flag+" ") }

// flagsAt returns the VmFlags of the mapping of this process holding addr.
func flagsAt(t *testing.T, addr uintptr) string {
	t.Helper()
	flags, err := flagsOf(addr)
	if err != nil {
		t.Fatal(err)
	}
	return flags
}

// flagsOf returns the VmFlags of the mapping of this process holding addr.
func flagsOf(addr uintptr) (string, error) {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	inside := false
	for sc.Scan() {
		line := sc.Text()
		if lo, hi, ok := vmaRange(line); ok {
			inside = lo <= addr && addr < hi
			continue
		}
		if inside {
			if flags, ok := strings.CutPrefix(line, "VmFlags:"); ok {
				return strings.TrimSpace(flags), nil
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("no mapping holds %#x", addr)
}

// vmaRange parses a mapping's header line, "lo-hi perms offset ...".
func vmaRange(line string) (lo, hi uintptr, ok bool) {
	field, _, _ := strings.Cut(line, " ")
	l, h, found := strings.Cut(field, "-")
	if !found {
		return 0, 0, false
	}
	a, err1 := strconv.ParseUint(l, 16, 64)
	b, err2 := strconv.ParseUint(h, 16, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return uintptr(a), uintptr(b), true
}

// hugeBytes is how much of this process's memory huge pages back.
func hugeBytes() (int64, error) {
	b, err := os.ReadFile("/proc/self/smaps_rollup")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "AnonHugePages:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("smaps_rollup: %q: %w", line, err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("smaps_rollup has no AnonHugePages line")
}

// residentPages counts the resident pages of this process's memory from
// start to end (mincore).
func residentPages(start, end uintptr) (int64, error) {
	pages := (end - start) / uintptr(os.Getpagesize())
	vec := make([]byte, pages)
	if _, _, errno := syscall.Syscall(syscall.SYS_MINCORE, start, end-start, uintptr(unsafe.Pointer(unsafe.SliceData(vec)))); errno != 0 {
		return 0, fmt.Errorf("mincore: %w", errno)
	}
	var n int64
	for _, v := range vec {
		n += int64(v & 1)
	}
	return n, nil
}

// Map: whole huge pages from a huge page boundary, all advised, zeroed,
// outside the Go heap (the runtime's heap counters do not move), and gone
// from the process's mappings once unmapped, however often unmap is called.
func TestMap(t *testing.T) {
	n := 3*Size + 5
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	buf, unmap := Map(n)
	runtime.ReadMemStats(&after)
	start := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	if len(buf) != n || cap(buf)%Size != 0 || cap(buf)-n >= Size || start%Size != 0 {
		t.Fatalf("Map(%d): len %d, cap %d, at %#x; want len %d, whole huge pages from a huge page boundary", n, len(buf), cap(buf), start, n)
	}
	if grew := after.HeapSys - before.HeapSys; grew >= uint64(n) {
		t.Fatalf("Map(%d) grew the Go heap by %d bytes; want memory outside it", n, grew)
	}
	checkAdvised(t, "Map's first byte", start)
	checkAdvised(t, "Map's last byte", start+uintptr(cap(buf))-1)
	whole := buf[:cap(buf)]
	for i := range whole {
		if whole[i] != 0 {
			t.Fatalf("Map(%d): byte %d is %d, want zeroed memory", n, i, whole[i])
		}
		whole[i] = byte(i)
	}
	unmap()
	unmap()
	if mapped(t, start) {
		t.Fatalf("%#x is still mapped after unmap", start)
	}
}

// mapped reports whether addr lies in one of the process's mappings.
func mapped(t *testing.T, addr uintptr) bool {
	t.Helper()
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		span, _, _ := strings.Cut(sc.Text(), " ")
		lo, hi, ok := strings.Cut(span, "-")
		if !ok {
			continue
		}
		l, err1 := strconv.ParseUint(lo, 16, 64)
		h, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 == nil && err2 == nil && uint64(addr) >= l && uint64(addr) < h {
			return true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return false
}
