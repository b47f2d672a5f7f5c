package gymstandin_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/tests/gymstandin"
)

// recording is what NeMo Gym's own control plane answered, recorded in a
// session that ran it (testdata/control-py-011c3386.json).
type recording struct {
	Sessions  map[string]string `json:"sessions"`
	Exchanges []struct {
		Name   string         `json:"name"`
		Server string         `json:"server"`
		Op     string         `json:"op"`
		Auth   string         `json:"auth"`
		Body   map[string]any `json:"body"`
		Status int            `json:"status"`
		Reply  any            `json:"reply"`
	} `json:"exchanges"`
	Files map[string]string `json:"files"`
}

// TestParticipant: the stand-in answers every call of the recording as
// Gym's control plane did - status, replies, errors, FastAPI's 422s - and
// writes the directory byte for byte as Gym's store.py wrote it.
func TestParticipant(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "control-py-011c3386.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rec recording
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	const token = "tok-rec"
	servers := map[string]*gymstandin.Participant{
		"source": gymstandin.StartParticipant(t, "gym_resources", token),
		"fresh":  gymstandin.StartParticipant(t, "gym_resources", token),
	}
	// Seeded in the recording's order (s1, then s2): Gym's participant
	// exports its sessions in the order they were bound.
	for _, s := range []struct{ session, rollout string }{{"s1", "r1"}, {"s2", "r2"}} {
		if rec.Sessions[s.session] != s.rollout {
			t.Fatalf("recording's sessions %v", rec.Sessions)
		}
		servers["source"].Seed(s.session, s.rollout, 0)
	}
	dir := filepath.Join(t.TempDir(), "ckpt-c1")
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	for _, ex := range rec.Exchanges {
		body := substitute(ex.Body, dir)
		method, reader := http.MethodPost, io.Reader(nil)
		if ex.Op == "status" {
			method = http.MethodGet
		} else {
			data, _ := json.Marshal(body)
			reader = bytes.NewReader(data)
		}
		req, err := http.NewRequestWithContext(t.Context(), method, servers[ex.Server].URL+"/ng-control/v1/checkpoint/"+ex.Op, reader)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		switch ex.Auth {
		case "":
			req.Header.Set("Authorization", "Bearer "+token)
		case "wrong":
			req.Header.Set("Authorization", "Bearer nope")
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", ex.Name, err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var got any
		if err := json.Unmarshal(raw, &got); err != nil {
			t.Fatalf("%s: reply %s: %v", ex.Name, raw, err)
		}
		got = normalize(got, dir)
		if resp.StatusCode != ex.Status || !reflect.DeepEqual(got, ex.Reply) {
			wantJSON, _ := json.Marshal(ex.Reply)
			gotJSON, _ := json.Marshal(got)
			t.Errorf("%s: %d %s\nGym's control plane answered %d %s", ex.Name, resp.StatusCode, gotJSON, ex.Status, wantJSON)
		}
	}
	pdir := filepath.Join(dir, "gym", "resources", "gym_resources")
	for name, want := range rec.Files {
		got, err := os.ReadFile(filepath.Join(pdir, name))
		if err != nil || string(got) != want {
			t.Errorf("%s: %q (%v)\nGym's store.py wrote %q", name, got, err, want)
		}
	}
}

// substitute makes a recorded body's placeholders this run's.
func substitute(v any, dir string) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			out[k] = substitute(e, dir)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = substitute(e, dir)
		}
		return out
	case string:
		now := float64(time.Now().UnixNano()) / 1e9
		switch x {
		case "$deadline":
			return now + 60
		case "$past":
			return now - 1
		}
		return strings.ReplaceAll(x, "$dir", dir)
	}
	return v
}

// normalize reduces a reply as the recording was: lease timestamps to
// $number, the directory to $dir, a 422's detail to each error's type and
// loc.
func normalize(v any, dir string) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			switch {
			case k == "lease_expires_at" && e != nil:
				out[k] = "$number"
			case k == "detail":
				if list, ok := e.([]any); ok {
					var kept []any
					for _, d := range list {
						m, _ := d.(map[string]any)
						kept = append(kept, map[string]any{"type": m["type"], "loc": m["loc"]})
					}
					out[k] = kept
					continue
				}
				out[k] = normalize(e, dir)
			default:
				out[k] = normalize(e, dir)
			}
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = normalize(e, dir)
		}
		return out
	case string:
		return strings.ReplaceAll(x, dir, "$dir")
	}
	return v
}
