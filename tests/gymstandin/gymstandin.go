// Package gymstandin holds test stand-ins for NeMo Gym's servers at the
// HTTP layer, shared by the tests that put our fleet next to Gym's
// (pkg/servers/agent, pkg/servers/environment, pkg/transport/httpclient, tests/inprocess,
// tests/upstream). What each mimics, at NeMo Gym commit
// 07d6b0d07b22fcf530b4c211dae2ee23100428e4:
//
//   - StartUvicorn: uvicorn as Gym runs every server (uvicorn.run in
//     nemo_gym/server_utils.py 733-763), HTTP/1.1 only, answering the h2c
//     preface as send_400_response in uvicorn/protocols/http/httptools_impl.py
//     does (uvicorn c1144fd4f130, the release Gym's pyproject.toml names).
//   - Counter: StatefulCounterResourcesServer
//     (resources_servers/example_session_state_mgmt/app.py 35-95) behind
//     the session middleware Gym installs (nemo_gym/server_utils.py 551-577)
//     and RolloutContextMiddleware (nemo_gym/rollout_correlation.py 93-115),
//     with the /close_session route nemo-gym 0.7.0 added to every resources
//     server (SimpleResourcesServer.close_resources_session), which the
//     interop suite (tests/interop/gym) found our environment sending {} to.
//
// It imports no package of ours but pkg/wire/rollout, so that pkg/transport/httpclient's
// own tests can use it without an import cycle.
package gymstandin

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// Uvicorn400 is what uvicorn writes to a client whose bytes do not parse as
// HTTP/1.x, the h2c preface included, before it closes the connection
// (send_400_response in uvicorn/protocols/http/httptools_impl.py at
// c1144fd4f130; its server and date headers left out).
const Uvicorn400 = "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n" +
	"content-length: 29\r\nconnection: close\r\n\r\nInvalid HTTP request received."

// Uvicorn is a running HTTP/1.1-only server that answers the h2c preface as
// uvicorn does.
type Uvicorn struct {
	URL    string
	probes atomic.Int64
}

// Probes is how many h2c prefaces the server was sent.
func (u *Uvicorn) Probes() int64 { return u.probes.Load() }

// StartUvicorn serves h as uvicorn serves a Gym server until the test ends:
// net/http's HTTP/1.1 server, except that a connection opening with the h2c
// preface gets Uvicorn400 and is closed.
func StartUvicorn(t testing.TB, h http.Handler) *Uvicorn {
	t.Helper()
	u := &Uvicorn{}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener = uvicornListener{Listener: srv.Listener, probes: &u.probes}
	srv.Start()
	t.Cleanup(srv.Close)
	u.URL = srv.URL
	return u
}

type uvicornListener struct {
	net.Listener
	probes *atomic.Int64
}

func (l uvicornListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &uvicornConn{Conn: nc, br: bufio.NewReader(nc), probes: l.probes}, nil
}

// uvicornConn answers the h2c preface as uvicorn does and hands any other
// first bytes to net/http's HTTP/1.1 server.
type uvicornConn struct {
	net.Conn
	br      *bufio.Reader
	checked bool
	probes  *atomic.Int64
}

func (c *uvicornConn) Read(b []byte) (int, error) {
	if !c.checked { // net/http reads a connection from one goroutine
		c.checked = true
		const priLine = "PRI * HTTP/2.0"
		if got, err := c.br.Peek(len(priLine)); err == nil && string(got) == priLine {
			c.probes.Add(1)
			io.WriteString(c.Conn, Uvicorn400)
			c.Conn.Close()
			return 0, io.EOF
		}
	}
	return c.br.Read(b)
}
