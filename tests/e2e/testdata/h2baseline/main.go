// Command h2baseline is the baseline of tests/e2e/h2attack_test.go: net/http
// handlers served over h2c (prior knowledge) by x/net's HTTP/2 server (the
// x/net of go.mod) with its defaults: /metrics by promhttp, as on our
// servers, and a POST that reads its whole body first, as the model
// server's chat route does. It prints its address on stdout.
package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/net/http2"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run() error {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.Handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Println(ln.Addr())
	// OPTIONS * is answered as net/http's server answers it (x/net's
	// ServeConn hands it to the handler): our clients' first request.
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodOptions && r.RequestURI == "*" {
			return
		}
		mux.ServeHTTP(w, r)
	})
	h2 := &http2.Server{}
	for {
		nc, err := ln.Accept()
		if err != nil {
			return err
		}
		go h2.ServeConn(nc, &http2.ServeConnOpts{Handler: handler, BaseConfig: &http.Server{}})
	}
}
