package agent

import "time"

// closedSessions remembers closed sessions in the order they were closed,
// so that forgetting the ones closed longer than closed_session_ttl ago
// pops them off the front instead of scanning every session.
//
// A closed session is kept at all only to answer a close sent again (the
// environment's cleanup resends one whose reply it lost, for up to its
// cleanup_retry_window) and to refuse a late activation with
// session_closed; it holds ids and observations (its request, reply and
// loop state are dropped at the close). Kept forever, a long-running agent
// grew with every session it served.
type closedSessions struct {
	queue []closedSession
	head  int
}

type closedSession struct {
	sess *session
	at   time.Time
}

func (c *closedSessions) push(sess *session, at time.Time) {
	c.queue = append(c.queue, closedSession{sess: sess, at: at})
}

// popExpired calls forget for each session closed at or before cutoff,
// oldest first.
func (c *closedSessions) popExpired(cutoff time.Time, forget func(*session)) {
	for c.head < len(c.queue) && !c.queue[c.head].at.After(cutoff) {
		forget(c.queue[c.head].sess)
		c.queue[c.head] = closedSession{}
		c.head++
	}
	// Reuse the front once it is more than half the slice.
	if c.head > 0 && c.head*2 >= len(c.queue) {
		n := copy(c.queue, c.queue[c.head:])
		clear(c.queue[n:])
		c.queue, c.head = c.queue[:n], 0
	}
}

// len is how many closed sessions are remembered.
func (c *closedSessions) len() int { return len(c.queue) - c.head }

// forgetClosedLocked drops the sessions closed more than the configured
// time ago. Called with s.mu held, on every open and close: the work is
// proportional to what expired, and an agent that serves nothing holds
// nothing new.
func (s *Server) forgetClosedLocked(now time.Time) {
	if s.cfg.ClosedSessionTTL <= 0 {
		return
	}
	// A session retired meanwhile is gone already and its id may name a
	// newer session: dropSessionLocked drops only the session it is given.
	s.closed.popExpired(now.Add(-s.cfg.ClosedSessionTTL), s.dropSessionLocked)
	s.metrics.closedHeld.Set(float64(s.closed.len()))
}
