package modelproxy_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
)

const okChat = `{"messages":[{"role":"user","content":"q"}]}`

// TestProtocolAuto: the default protocol finds HTTP/1.1 (a vLLM) and h2c
// (fakeinference) out by itself.
func TestProtocolAuto(t *testing.T) {
	t.Run("http1", func(t *testing.T) {
		up := newStub(t)
		up.script(replyJSON(200, completion(`{"role":"assistant","content":"hi"}`, "stop", []int{1}, []int{2})))
		p := newProxy(t, up, func(c *modelproxy.Config) { c.Upstream.H2C, c.Upstream.Protocol = false, modelproxy.ProtocolAuto })
		if status, b := p.get(t, "/readyz"); status != 200 {
			t.Fatalf("readyz = %d %s", status, b)
		}
		if status, b := p.post(t, "/v1/chat/completions", okChat); status != 200 {
			t.Fatalf("call = %d %s", status, b)
		}
	})
	t.Run("h2c", func(t *testing.T) {
		fcfg := fakeinference.DefaultConfig()
		fcfg.Listen = "127.0.0.1:0"
		fi, err := fakeinference.New(fcfg, fakeinference.Deps{})
		if err != nil {
			t.Fatal(err)
		}
		if err := fi.Listen(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- fi.Serve() }()
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = fi.Close(ctx)
			<-done
		})
		p := startProxy(t, func(c *modelproxy.Config) {
			c.Upstream.BaseURL, c.Upstream.Protocol = fi.URL()+"/v1", modelproxy.ProtocolAuto
			c.Upstream.Model = fcfg.Model
		})
		if status, b := p.post(t, "/v1/chat/completions", okChat); status != 200 {
			t.Fatalf("call = %d %s", status, b)
		}
		if status, b := p.get(t, "/readyz"); status != 200 {
			t.Fatalf("readyz = %d %s", status, b)
		}
	})
}

// TestProtocolH2CAgainstHTTP1: h2c forced against a vLLM-like HTTP/1.1
// server says which key is wrong, on /readyz and on calls.
func TestProtocolH2CAgainstHTTP1(t *testing.T) {
	up := newStub(t)
	up.script(replyJSON(200, completion(`{"role":"assistant","content":"hi"}`, "stop", []int{1}, []int{2})))
	p := newProxy(t, up, func(c *modelproxy.Config) { c.Upstream.H2C = true })
	status, b := p.get(t, "/readyz")
	if status != http.StatusServiceUnavailable || !strings.Contains(string(b), "upstream.protocol") {
		t.Fatalf("readyz = %d %s", status, b)
	}
	status, b = p.post(t, "/v1/chat/completions", okChat)
	if status != http.StatusBadGateway || !strings.Contains(string(b), "upstream.protocol") {
		t.Fatalf("call = %d %s", status, b)
	}
}

// TestReadyzFollowsTheUpstream: the server starts while its upstream is
// down, is not ready until the upstream answers, then is.
func TestReadyzFollowsTheUpstream(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p := startProxy(t, func(c *modelproxy.Config) { c.Upstream.BaseURL = "http://" + addr + "/v1" })
	status, b := p.get(t, "/readyz")
	if status != http.StatusServiceUnavailable || !strings.Contains(string(b), "does not answer") {
		t.Fatalf("readyz with the upstream down = %d %s", status, b)
	}
	if status, b := p.post(t, "/v1/chat/completions", okChat); status != http.StatusBadGateway {
		t.Fatalf("call with the upstream down = %d %s", status, b)
	}

	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listening again on %s: %v", addr, err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"object":"list","data":[]}`)
	}))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	deadline := time.Now().Add(10 * time.Second)
	for {
		status, b = p.get(t, "/readyz")
		if status == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("readyz after the upstream came up = %d %s", status, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startProxy starts a model server on cfg without a stub.
func startProxy(t *testing.T, mutate func(*modelproxy.Config)) *proxy {
	t.Helper()
	up := &stub{srv: &httptest.Server{URL: "http://127.0.0.1:1"}}
	return newProxy(t, up, mutate)
}
