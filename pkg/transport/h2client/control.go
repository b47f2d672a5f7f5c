package h2client

import (
	"fmt"

	"github.com/gymfleet/gymfleet/pkg/transport/h2frame"
)

// errControlUnread fails a connection whose server left
// h2frame.MaxQueuedControlFrames of our answers (PING and SETTINGS acks,
// window updates, resets) unread: it is not reading.
var errControlUnread = fmt.Errorf("h2client: the server left %d of our control frames unread", h2frame.MaxQueuedControlFrames)

// queueControl queues a frame the read loop answers with and makes sure a
// goroutine writes it: the read loop never waits on the socket, so a
// writer stalled on a server that is not reading never stops the replies
// already sent to us from arriving (h2frame.ControlQueue).
func (c *Conn) queueControl(f h2frame.Control) error {
	start, full := c.ctrl.Push(f, func() { c.flushers.Add(1) })
	if full {
		return errControlUnread
	}
	if start {
		go c.flushControl()
	}
	return nil
}

// flushControl writes queued control frames until none is left. It is
// owned by the connection: Close waits for it.
func (c *Conn) flushControl() {
	defer c.flushers.Done()
	for c.ctrl.More(c.writeFrames(nil)) { // writeFrames drains the queue, then flushes
	}
}

// drainControlLocked writes the queued control frames; the caller holds
// wmu. Every writer drains first, so frames leave in the order queued.
func (c *Conn) drainControlLocked() error {
	return c.ctrl.Drain(func(f *h2frame.Control) error { return f.Write(c.fr, c.henc, &c.hbuf) })
}
