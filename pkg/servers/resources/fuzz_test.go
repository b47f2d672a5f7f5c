package resources_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/servers/resources"
)

// fuzzServer returns an in-process counter or weather server whose handler a
// fuzz target drives without a listener.
func fuzzServer(f *testing.F, typ string) http.Handler {
	cfg := resources.DefaultConfig()
	cfg.Name, cfg.Type = typ, typ
	srv, err := resources.New(cfg, resources.Deps{})
	if err != nil {
		f.Fatal(err)
	}
	return srv.Handler()
}

// serve runs one request and fails on a 5xx or a reply that is not JSON.
func serve(t *testing.T, h http.Handler, path, session string, body []byte) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	if session != "" {
		req.Header.Set(resources.SessionHeader, session)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code >= 500 {
		t.Fatalf("POST %s %q: %d %s", path, body, rec.Code, rec.Body)
	}
	if !json.Valid(rec.Body.Bytes()) {
		t.Fatalf("POST %s %q: reply is not JSON: %q", path, body, rec.Body)
	}
	return rec
}

func FuzzSeedSession(f *testing.F) {
	h := fuzzServer(f, resources.TypeCounter)
	for _, s := range []string{``, `{}`, `{"initial_count":3}`, `{"initial_count":-1e3}`, `{"initial_count":"3"}`, `{"initial_count":1.5}`,
		`{"initial_count":null}`, `[1]`, `{"initial_count":99999999999999999999}`, `{"responses_create_params":{"input":[]}}`, `{`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := serve(t, h, "/ng-rollout/r/seed_session", "s", body)
		if rec.Code == 200 {
			rec = serve(t, h, "/ng-rollout/r/get_counter_value", "s", nil)
			if rec.Code != 200 {
				t.Fatalf("seeded session not usable: %d %s", rec.Code, rec.Body)
			}
		}
		serve(t, h, "/close_session", "s", nil)
	})
}

func FuzzToolArguments(f *testing.F) {
	counter := fuzzServer(f, resources.TypeCounter)
	weather := fuzzServer(f, resources.TypeWeather)
	serveSeed := httptest.NewRequest(http.MethodPost, "/seed_session", nil)
	serveSeed.Header.Set(resources.SessionHeader, "s")
	counter.ServeHTTP(httptest.NewRecorder(), serveSeed)
	for _, s := range []string{``, `{}`, `{"by":1}`, `{"by":-9223372036854775808}`, `{"by":1e400}`, `{"city":"Paris"}`, `{"city":""}`,
		`{"city":null}`, `"x"`, `null`, `{"by":{"a":1}}`, "{\"city\":\"\xff\"}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		serve(t, counter, "/increment", "s", body)
		serve(t, counter, "/get_counter_value", "s", body)
		serve(t, weather, "/get_weather", "", body)
	})
}

func FuzzVerify(f *testing.F) {
	counter := fuzzServer(f, resources.TypeCounter)
	weather := fuzzServer(f, resources.TypeWeather)
	for _, s := range []string{``, `{}`, `{"responses_create_params":{},"response":{"output":[]},"expected_count":0}`,
		`{"responses_create_params":{},"response":{"output":[{"type":"function_call_output","call_id":"c","output":[]}]}}`,
		`{"responses_create_params":{},"response":{"output":[{"type":"message","role":"assistant","content":null}]}}`,
		`{"responses_create_params":1,"response":{"output":"x"}}`, `{"responses_create_params":{},"response":[]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		serve(t, counter, "/verify", "s", body)
		serve(t, weather, "/verify", "", body)
	})
}
