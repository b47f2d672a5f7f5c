//go:build linux

package ckptstore

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

func TestMakeLarge_AdvisesHugePages(t *testing.T) {
	if _, err := os.Stat("/sys/kernel/mm/transparent_hugepage/enabled"); err != nil {
		// A kernel built without THP refuses MADV_HUGEPAGE and the buffer
		// is a plain one (TestMakeLarge_SmallBuffersArePlain still runs);
		// there is no advice whose effect could be checked.
		t.Skip("this kernel has no transparent huge pages (no /sys/kernel/mm/transparent_hugepage)")
	}
	n := 8*hugePage + 123
	buf := makeLarge(n)
	if len(buf) != n {
		t.Fatalf("len %d, want %d", len(buf), n)
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	start := (base + hugePage - 1) &^ (hugePage - 1)
	flags, err := vmaFlags(start)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(" "+flags+" ", " hg ") {
		t.Errorf("the mapping holding the buffer's aligned interior has VmFlags %q, want hg (huge pages advised)", flags)
	}
	for i := range buf {
		if buf[i] != 0 {
			t.Fatalf("byte %d is %d, want a zeroed buffer", i, buf[i])
		}
		buf[i] = byte(i)
	}
}

func TestMakeLarge_SmallBuffersArePlain(t *testing.T) {
	for _, n := range []int{0, 1, hugePage, 2*hugePage - 1} {
		buf := makeLarge(n)
		if len(buf) != n {
			t.Fatalf("makeLarge(%d): len %d", n, len(buf))
		}
		clear(buf)
	}
}

// vmaFlags returns the VmFlags of the mapping of this process holding addr.
func vmaFlags(addr uintptr) (string, error) {
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
