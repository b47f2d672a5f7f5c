package fleet_test

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// helperEnv switches the test binary into a fake fleet server.
const helperEnv = "GYMFLEET_FLEET_TEST_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(runHelper(mode))
	}
	goleak.VerifyTestMain(m)
}

// runHelper is a tiny server: --config names a file holding its listen
// address; it serves /readyz and writes the address file as the fleet's
// servers do. Modes: serve, never-ready, crash, sleep.
func runHelper(mode string) int {
	fs := flag.NewFlagSet("helper", flag.ContinueOnError)
	config := fs.String("config", "", "")
	addrFile := fs.String("addr-file", "", "")
	_ = fs.Parse(os.Args[1:])
	fmt.Printf("helper %s pid %d echo=%q checkpoint=%q\n", mode, os.Getpid(), os.Getenv("GYMFLEET_TEST_ECHO"), os.Getenv("GYMFLEET_CHECKPOINT_ENABLED"))

	switch mode {
	case "sleep":
		time.Sleep(time.Hour)
		return 0
	case "crash":
		fmt.Fprintln(os.Stderr, "helper crashing on purpose")
		return 3
	}
	if os.Getenv("HELPER_IGNORE_TERM") == "1" {
		signal.Ignore(syscall.SIGTERM)
	}
	if f := os.Getenv("HELPER_GRANDCHILD_FILE"); f != "" {
		self, _ := os.Executable()
		child := exec.Command(self)
		child.Env = append(os.Environ(), helperEnv+"=sleep")
		if err := child.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		_ = os.WriteFile(f, []byte(strconv.Itoa(child.Process.Pid)), 0o644)
	}
	addr, err := os.ReadFile(*config)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ln, err := net.Listen("tcp", string(addr))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_ = os.WriteFile(*addrFile, []byte("svc "+ln.Addr().String()+"\n"), 0o644)
	status := http.StatusOK
	if mode == "never-ready" {
		status = http.StatusServiceUnavailable
	}
	go func() {
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(status) }))
	}()
	if os.Getenv("HELPER_IGNORE_TERM") == "1" {
		time.Sleep(time.Hour)
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	<-term
	fmt.Println("helper stopping on SIGTERM")
	return 0
}
