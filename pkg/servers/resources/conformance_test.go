package resources_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/servers/resources"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// errorCode is the code of an error reply, "" for any other body.
func errorCode(body string) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal([]byte(body), &e)
	return e.Error.Code
}

// probeCall is the tool call each type's probe makes.
var probeCall = map[string][2]string{
	resources.TypeWeather:    {"/get_weather", `{"city":"Paris"}`},
	resources.TypeSlowVerify: {"/get_weather", `{"city":"Paris"}`},
	resources.TypeCounter:    {"/increment", `{"by":1}`},
}

func TestConformance(t *testing.T) {
	cases := []struct{ typ, mode string }{
		{resources.TypeWeather, ""},
		{resources.TypeCounter, ""},
		{resources.TypeSlowVerify, ""},
		{resources.TypeCounter, resources.ModeRestartOnly},
	}
	for _, c := range cases {
		t.Run(c.typ+"/"+c.mode, func(t *testing.T) {
			ctlplanetest.Run(t, func(t *testing.T, cfg ctlplane.Config) ctlplanetest.Subject {
				ts := start(t, c.typ, func(rc *resources.Config) {
					rc.Name = "res-" + c.typ
					rc.Checkpoint, rc.CheckpointMode = cfg, c.mode
				})
				call := probeCall[c.typ]
				return ctlplanetest.Subject{
					URL: ts.url, Kind: ctlplane.KindResources, Instance: "res-" + c.typ,
					// A tool call of the episode, on a session the episode seeded.
					Probe: func(_ context.Context, id rollout.EpisodeID) (int, string) {
						sid := "probe-" + id.CaptureKey()
						if r := ts.post(rollout.Path(id, "/seed_session"), sid, `{}`); r.status != 200 {
							return r.status, errorCode(r.body)
						}
						r := ts.post(rollout.Path(id, call[0]), sid, call[1])
						return r.status, errorCode(r.body)
					},
				}
			})
		})
	}
}

func TestConformance_Disabled(t *testing.T) {
	for _, typ := range resources.Types() {
		t.Run(typ, func(t *testing.T) {
			ts := start(t, typ)
			ctlplanetest.RunDisabled(t, ts.url)
		})
	}
}
