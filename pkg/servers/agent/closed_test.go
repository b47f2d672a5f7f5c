package agent

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// closedTestAgent is an agent whose handler is driven without a listener,
// so it runs inside a synctest bubble (time advances only when every
// goroutine waits).
func closedTestAgent(t *testing.T, ttl time.Duration) (*Server, func(path, body string) (int, string)) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.ClosedSessionTTL = ttl
	s, err := New(cfg, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	post := func(path, body string) (int, string) {
		rec := httptest.NewRecorder()
		s.router.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, bytes.NewReader([]byte(body))))
		return rec.Code, rec.Body.String()
	}
	return s, post
}

func openIn(t *testing.T, post func(path, body string) (int, string), rollout, sessionID string) {
	t.Helper()
	if code, body := post("/ng-rollout/"+rollout+"/v1/agent_sessions", `{"session_id":"`+sessionID+`","resources_session_id":"rs-`+sessionID+`"}`); code != 200 {
		t.Fatalf("open %s: %d %s", sessionID, code, body)
	}
}

func closeIn(post func(path, body string) (int, string), sessionID string) (int, string) {
	return post("/v1/agent_sessions/close", `{"session_id":"`+sessionID+`"}`)
}

func (s *Server) sessionCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

// TestClosedSessions_ForgottenAfterTTL: a closed session answers a close
// sent again until closed_session_ttl after its close, then is forgotten
// (a close of it is an unknown session) at the next open or close; open
// sessions stay however old.
func TestClosedSessions_ForgottenAfterTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, post := closedTestAgent(t, time.Minute)
		openIn(t, post, "r1", "s1")
		openIn(t, post, "r2", "s2")
		if code, body := closeIn(post, "s1"); code != 200 || !strings.Contains(body, `"closed":true`) {
			t.Fatalf("first close: %d %s", code, body)
		}

		time.Sleep(59 * time.Second)
		openIn(t, post, "r3", "s3")
		if code, body := closeIn(post, "s1"); code != 200 || !strings.Contains(body, `"closed":false`) {
			t.Fatalf("close sent again within the TTL: %d %s, want 200 closed:false", code, body)
		}

		time.Sleep(time.Second)
		openIn(t, post, "r4", "s4")
		if code, body := closeIn(post, "s1"); code != 404 || !strings.Contains(body, `"code":"unknown_session"`) {
			t.Fatalf("close after the TTL: %d %s, want 404 unknown_session", code, body)
		}
		if got := s.sessionCount(); got != 3 {
			t.Fatalf("%d sessions held, want 3 (s2, s3, s4 open; s1 forgotten)", got)
		}

		// Open sessions are never forgotten, however old.
		time.Sleep(time.Hour)
		if code, body := closeIn(post, "s2"); code != 200 || !strings.Contains(body, `"closed":true`) {
			t.Fatalf("close of a session open for an hour: %d %s", code, body)
		}
		if got := s.sessionCount(); got != 3 {
			t.Fatalf("%d sessions held after closing s2, want 3 (s2 closed just now, s3, s4)", got)
		}
	})
}

// TestClosedSessions_TTLZeroKeepsThem: closed_session_ttl 0 is the old
// behaviour, every closed session remembered.
func TestClosedSessions_TTLZeroKeepsThem(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, post := closedTestAgent(t, 0)
		openIn(t, post, "r1", "s1")
		closeIn(post, "s1")
		time.Sleep(1000 * time.Hour)
		openIn(t, post, "r2", "s2")
		if code, body := closeIn(post, "s1"); code != 200 || !strings.Contains(body, `"closed":false`) {
			t.Fatalf("close sent again with ttl 0: %d %s, want 200 closed:false", code, body)
		}
		if got := s.sessionCount(); got != 2 {
			t.Fatalf("%d sessions held, want 2", got)
		}
	})
}

// TestClosedSessions_StaleEntrySparesANewerSession: a closed session
// dropped otherwise (a retire) leaves its entry in the queue; when it
// expires it must not remove a newer session that reuses the id.
func TestClosedSessions_StaleEntrySparesANewerSession(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, post := closedTestAgent(t, time.Minute)
		openIn(t, post, "r1", "s1")
		closeIn(post, "s1")
		s.mu.Lock()
		s.dropSessionLocked(s.sessions["s1"])
		s.mu.Unlock()
		openIn(t, post, "r1b", "s1")

		time.Sleep(2 * time.Minute)
		openIn(t, post, "r2", "s2")
		if got := s.sessionCount(); got != 2 {
			t.Fatalf("%d sessions held, want 2 (the newer s1 and s2)", got)
		}
		if code, body := closeIn(post, "s1"); code != 200 || !strings.Contains(body, `"closed":true`) {
			t.Fatalf("close of the newer s1: %d %s", code, body)
		}
	})
}

func TestClosedSessions_QueueReusesItsFront(t *testing.T) {
	var c closedSessions
	t0 := time.Unix(1000, 0)
	var sess [10]session
	for i := range sess {
		c.push(&sess[i], t0.Add(time.Duration(i)*time.Second))
	}
	var forgotten []*session
	c.popExpired(t0.Add(5*time.Second), func(s *session) { forgotten = append(forgotten, s) })
	if len(forgotten) != 6 || forgotten[0] != &sess[0] || forgotten[5] != &sess[5] {
		t.Fatalf("forgot %d sessions, want the 6 closed at or before the cutoff, oldest first", len(forgotten))
	}
	if c.len() != 4 || c.head != 0 || len(c.queue) != 4 || c.queue[0].sess != &sess[6] {
		t.Fatalf("after popping 6 of 10: len %d, head %d, queue %d; want the 4 left moved to the front", c.len(), c.head, len(c.queue))
	}
	c.popExpired(t0, func(*session) { t.Fatal("forgot a session closed after the cutoff") })
	c.popExpired(t0.Add(time.Hour), func(*session) {})
	if c.len() != 0 {
		t.Fatalf("%d left after every one expired", c.len())
	}
}
