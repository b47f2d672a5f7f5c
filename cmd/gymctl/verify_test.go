package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/coordination"
	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
)

// gymctl ckpt verify checks signatures with the fleet file's key (or
// --signing-key-file), fails with another key, and without any key says
// the signatures were not checked.
func TestCkptVerify_Signatures(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "ckroot")
	writeKey := func(name, key string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(key+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	key := writeKey("key", strings.Repeat("k", 32))
	other := writeKey("other", strings.Repeat("o", 32))
	cfg := ctlplane.Config{Enabled: true, ControlAuthToken: "tok", LeaseGraceSeconds: 600, Root: root, SigningKeyFile: key}
	var eps []coordination.Endpoint
	endpoints := ""
	for _, p := range []struct{ name, kind string }{{"env", ctlplane.KindEnvironment}, {"policy", ctlplane.KindModel}} {
		c, err := ctlplane.New(cfg, ctlplanetest.NewFake(p.kind, p.name), ctlplane.Deps{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		r := httpserver.NewRouter(httpserver.RouterOptions{})
		c.Mount(r)
		url := h2cServer(t, r.ServeHTTP).URL
		eps = append(eps, coordination.Endpoint{Name: p.name, URL: url})
		endpoints += "  - name: " + p.name + "\n    binary: x\n    endpoints: [{name: " + p.name + ", kind: " + p.kind + ", url: \"" + url + "\"}]\n"
	}
	ctx := context.Background()
	co, err := coordination.Discover(ctx, eps, coordination.Options{Token: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	ckdir := filepath.Join(root, "c1")
	if res, err := co.Prepare(ctx, "c1", deadline); err != nil || !res.Prepared {
		t.Fatalf("prepare: %+v %v", res, err)
	}
	if _, err := co.Commit(ctx, "c1", ckdir, nil, deadline, false); err != nil {
		t.Fatal(err)
	}
	if err := co.Resume(ctx, "c1", deadline); err != nil {
		t.Fatal(err)
	}
	fleetFile := func(name, keyLine string) string {
		p := filepath.Join(dir, name)
		text := "checkpoint: {enabled: true, control_auth_token: tok, root: " + root + keyLine + "}\nprocesses:\n" + endpoints
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keyed, unkeyed := fleetFile("keyed.yaml", ", signing_key_file: "+key), fleetFile("unkeyed.yaml", "")

	stdout, _, err := runArgs(t, "ckpt", "verify", "--config", keyed, "--id", "c1", "--dir", ckdir)
	if err != nil || !strings.Contains(stdout, "every manifest is signed with the key in "+key) {
		t.Errorf("verify with the fleet file's key: %v\n%s", err, stdout)
	}
	_, _, err = runArgs(t, "ckpt", "verify", "--config", keyed, "--id", "c1", "--dir", ckdir, "--signing-key-file", other)
	if err == nil || !strings.Contains(err.Error(), "signature") {
		t.Errorf("verify with another key: %v, want a refusal naming the signature", err)
	}
	stdout, _, err = runArgs(t, "ckpt", "verify", "--config", unkeyed, "--id", "c1", "--dir", ckdir)
	if err != nil || !strings.Contains(stdout, "2 of 2 manifests carry a signature, NOT checked") {
		t.Errorf("verify without a key: %v\n%s", err, stdout)
	}
	stdout, _, err = runArgs(t, "ckpt", "verify", "--config", unkeyed, "--id", "c1", "--dir", ckdir, "--signing-key-file", key)
	if err != nil || !strings.Contains(stdout, "every manifest is signed") {
		t.Errorf("verify with --signing-key-file: %v\n%s", err, stdout)
	}
}
