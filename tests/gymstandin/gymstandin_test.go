package gymstandin_test

import (
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/tests/gymstandin"
)

// post sends body to url with cookies (none: a new session) and returns the
// status, the body and the cookies the reply set.
func post(t *testing.T, url, body string, cookies []*http.Cookie) (int, string, []*http.Cookie) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cookies {
		req.AddCookie(c)
	}
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Cookies()
}

// TestCounter_GymSanity replays Gym's own test of the server
// (resources_servers/example_session_state_mgmt/tests/test_app.py 28-66 at
// 07d6b0d07b22): sessions live in the cookie alone, each reply's cookie
// carries the session on.
func TestCounter_GymSanity(t *testing.T) {
	g := gymstandin.StartCounter(t, gymstandin.CounterOptions{Name: "c"})
	expect := func(what, url, body string, cookies []*http.Cookie, want string) []*http.Cookie {
		t.Helper()
		status, got, set := post(t, g.URL+url, body, cookies)
		if status != 200 || got != want {
			t.Fatalf("%s: %d %s, want 200 %s", what, status, got, want)
		}
		if len(set) != 1 || set[0].Name != "StatefulCounterResourcesServer___c" {
			t.Fatalf("%s: cookies set %v, want the session cookie", what, set)
		}
		return set
	}
	first := expect("first read", "/get_counter_value", "", nil, `{"count":0}`)
	expect("add 2", "/increment_counter", `{"count": 2}`, first, `{"success":true}`)
	expect("read", "/get_counter_value", "", first, `{"count":2}`)
	next := expect("add 4, new session", "/increment_counter", `{"count": 4}`, nil, `{"success":true}`)
	next = expect("read", "/get_counter_value", "", next, `{"count":4}`)
	next = expect("add 3", "/increment_counter", `{"count": 3}`, next, `{"success":true}`)
	expect("read", "/get_counter_value", "", next, `{"count":7}`)
	expect("first session", "/get_counter_value", "", first, `{"count":2}`)
	if started, counted := g.Sessions(); started != 2 || counted != 2 {
		t.Errorf("sessions: %d started, %d counted; want 2, 2", started, counted)
	}
	want := []string{"/get_counter_value session=new", "/increment_counter session=s1", "/get_counter_value session=s1", "/increment_counter session=new", "/get_counter_value session=s2", "/increment_counter session=s2", "/get_counter_value session=s2", "/get_counter_value session=s1"}
	if got := g.Requests(); !slices.Equal(got, want) {
		t.Errorf("requests:\n got %q\nwant %q", got, want)
	}
}

// TestCounter_SeedVerifyAndRefusals: the seed sets a session's counter once,
// /verify rewards the expected count under the capture prefix, a missing
// integer is FastAPI's 422, and /close_session takes nemo-gym 0.7.0's
// {resources_session_id, episode_id} only.
func TestCounter_SeedVerifyAndRefusals(t *testing.T) {
	g := gymstandin.StartCounter(t, gymstandin.CounterOptions{})
	_, _, ck := post(t, g.URL+"/seed_session", `{"initial_count": 3}`, nil)
	post(t, g.URL+"/seed_session", `{"initial_count": 9}`, ck)
	if n, ok := g.Count("s1"); !ok || n != 3 {
		t.Errorf("seeded counter %d %v, want 3", n, ok)
	}
	g.SetCount("s1", 6)
	status, body, _ := post(t, g.URL+"/ng-rollout/0-0/verify", `{"responses_create_params":{"input":"x"},"response":{"id":"r"},"expected_count":6}`, ck)
	if want := `{"response":{"id":"r"},"responses_create_params":{"input":"x"},"reward":1.0}`; status != 200 || body != want {
		t.Errorf("verify: %d %s, want 200 %s", status, body, want)
	}
	for _, c := range []struct{ path, body string }{
		{"/seed_session", `{}`},
		{"/increment_counter", `{"count": 1.5}`},
		{"/verify", `{"expected_count": 6}`},
	} {
		if status, body, _ := post(t, g.URL+c.path, c.body, ck); status != http.StatusUnprocessableEntity {
			t.Errorf("%s %s: %d %s, want 422", c.path, c.body, status, body)
		}
	}
	for _, bad := range []string{`{}`, `{"resources_session_id":"r"}`, `{"resources_session_id":"r","episode_id":{"rollout_id":"-x"}}`, `{"resources_session_id":"r","episode_id":{"rollout_id":"x"},"more":1}`} {
		if status, body, _ := post(t, g.URL+"/close_session", bad, ck); status != http.StatusUnprocessableEntity {
			t.Errorf("close_session %s: %d %s, want 422", bad, status, body)
		}
	}
	status, body, _ = post(t, g.URL+"/close_session", `{"resources_session_id":"r","episode_id":{"rollout_id":"t-1","attempt":0}}`, ck)
	if status != 200 || body != `{"resources_session_id":"r"}` {
		t.Errorf("close_session: %d %s", status, body)
	}
}

// TestUvicorn_AnswersTheH2CPreface: the h2c preface gets uvicorn's 400 and
// the connection closes; HTTP/1.1 reaches the handler.
func TestUvicorn_AnswersTheH2CPreface(t *testing.T) {
	u := gymstandin.StartUvicorn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Proto)
	}))
	nc, err := net.Dial("tcp", strings.TrimPrefix(u.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(nc, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	if got, err := io.ReadAll(nc); err != nil || string(got) != gymstandin.Uvicorn400 {
		t.Errorf("reply to the preface %q (%v), want %q", got, err, gymstandin.Uvicorn400)
	}
	if n := u.Probes(); n != 1 {
		t.Errorf("%d probes counted, want 1", n)
	}
	if status, body, _ := post(t, u.URL, "", nil); status != 200 || body != "HTTP/1.1" {
		t.Errorf("HTTP/1.1 request: %d %s", status, body)
	}
}
