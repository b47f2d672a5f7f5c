package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gymfleet/gymfleet/cmd/internal/lifecycle"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newServer(name string) *httpserver.Server {
	return httpserver.New(httpserver.Config{Addr: "127.0.0.1:0"}, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, name)
	}))
}

// announced collects the announce callbacks and signals once all came.
type announced struct {
	mu    sync.Mutex
	lines []string
	want  int
	all   chan struct{}
}

func newAnnounced(want int) *announced { return &announced{want: want, all: make(chan struct{})} }

func (a *announced) announce(name, addr string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lines = append(a.lines, name+" "+addr)
	if len(a.lines) == a.want {
		close(a.all)
	}
}

func TestRun_ServesAnnouncesAndStops(t *testing.T) {
	addrFile := filepath.Join(t.TempDir(), "addrs")
	servers := []lifecycle.Named{{Name: "weather", Server: newServer("weather")}, {Name: "counter", Server: newServer("counter")}}
	ann := newAnnounced(2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- lifecycle.Run(ctx, servers, addrFile, ann.announce, nil) }()
	<-ann.all
	// The file is written after the announcements: poll for it, as a
	// launcher does.
	var b []byte
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(5 * time.Second); ; <-tick.C {
		var err error
		if b, err = os.ReadFile(addrFile); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no address file: %v", err)
		}
	}
	want := fmt.Sprintf("weather %s\ncounter %s\n", servers[0].Server.Addr(), servers[1].Server.Addr())
	if string(b) != want {
		t.Fatalf("address file = %q, want %q", b, want)
	}
	if got := strings.Join(ann.lines, "\n") + "\n"; got != want {
		t.Fatalf("announced %q, want %q", got, want)
	}
	if entries, _ := os.ReadDir(filepath.Dir(addrFile)); len(entries) != 1 {
		t.Fatalf("the address file's directory holds %d entries; a temp file was left", len(entries))
	}

	c := httpclient.New(httpclient.Options{H2C: true})
	defer c.CloseIdleConnections()
	for _, s := range servers {
		rep, err := httpclient.Do(ctx, c, http.MethodGet, "http://"+s.Server.Addr()+"/", nil, nil)
		if err != nil || string(rep.Body) != s.Name {
			t.Fatalf("%s answered %v, %v", s.Name, rep, err)
		}
	}

	cancel()
	if err := <-ran; err != nil {
		t.Fatalf("Run after cancel = %v, want nil", err)
	}
	for _, s := range servers {
		if s.Server.(*httpserver.Server).Context().Err() == nil {
			t.Errorf("%s was not closed", s.Name)
		}
	}
}

// fakeServer is a lifecycle.Server whose Serve fails or blocks until Close.
type fakeServer struct {
	listenErr, serveErr error
	closed              chan struct{}
	once                sync.Once
	closeCalls          int
	mu                  sync.Mutex
}

func newFake(listenErr, serveErr error) *fakeServer {
	return &fakeServer{listenErr: listenErr, serveErr: serveErr, closed: make(chan struct{})}
}

func (f *fakeServer) Listen() error { return f.listenErr }
func (f *fakeServer) Addr() string  { return "fake:1" }

func (f *fakeServer) Serve() error {
	if f.serveErr != nil {
		return f.serveErr
	}
	<-f.closed
	return nil
}

func (f *fakeServer) Close(context.Context) error {
	f.mu.Lock()
	f.closeCalls++
	f.mu.Unlock()
	f.once.Do(func() { close(f.closed) })
	return nil
}

func (f *fakeServer) wasClosed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closeCalls > 0
}

func TestRun_ServeErrorStopsAll(t *testing.T) {
	boom := errors.New("boom")
	healthy := newServer("healthy")
	failing := newFake(nil, boom)
	err := lifecycle.Run(context.Background(), []lifecycle.Named{{Name: "healthy", Server: healthy}, {Name: "failing", Server: failing}}, "", nil, nil)
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "failing: serve: boom") {
		t.Fatalf("Run = %v, want failing's serve error", err)
	}
	if healthy.Context().Err() == nil || !failing.wasClosed() {
		t.Fatal("Run returned without closing every server")
	}
}

func TestRun_ListenErrorClosesTheOthers(t *testing.T) {
	first, third := newFake(nil, nil), newFake(nil, nil)
	refused := errors.New("address in use")
	err := lifecycle.Run(context.Background(), []lifecycle.Named{
		{Name: "first", Server: first}, {Name: "second", Server: newFake(refused, nil)}, {Name: "third", Server: third},
	}, "", func(string, string) { t.Error("announced although a server could not listen") }, nil)
	if !errors.Is(err, refused) || !strings.HasPrefix(err.Error(), "second: ") {
		t.Fatalf("Run = %v, want second's listen error", err)
	}
	if !first.wasClosed() {
		t.Fatal("the server that listened was not closed")
	}
	if third.wasClosed() {
		t.Fatal("a server that never listened was closed")
	}
}

func TestRun_AddrFileError(t *testing.T) {
	s := newFake(nil, nil)
	err := lifecycle.Run(context.Background(), []lifecycle.Named{{Name: "s", Server: s}}, filepath.Join(t.TempDir(), "no", "such", "dir", "addrs"), nil, nil)
	if err == nil || !strings.Contains(err.Error(), "write address file") {
		t.Fatalf("Run = %v, want an address file error", err)
	}
	if !s.wasClosed() {
		t.Fatal("the server was not closed")
	}
}

func TestWriteAddrFile(t *testing.T) {
	if err := lifecycle.WriteAddrFile("", "ignored"); err != nil {
		t.Fatalf("empty path: %v", err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "addrs")
	for _, content := range []string{"a 127.0.0.1:1\n", "b 127.0.0.1:2\n"} {
		if err := lifecycle.WriteAddrFile(path, content); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil || string(b) != content {
			t.Fatalf("file = %q, %v; want %q", b, err, content)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"addrs"}) {
		t.Fatalf("directory holds %q", names)
	}
}
