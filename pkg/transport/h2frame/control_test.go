package h2frame

import (
	"errors"
	"testing"
)

func TestControlQueue_FramesLeaveInOrderOnceAFlusherIsStarted(t *testing.T) {
	var q ControlQueue
	starts := 0
	for i := range 3 {
		start, full := q.Push(Control{Kind: WindowUpdate, Val: uint32(i)}, func() { starts++ })
		if full || start != (i == 0) {
			t.Fatalf("push %d: start %v full %v", i, start, full)
		}
	}
	if starts != 1 {
		t.Fatalf("onStart ran %d times, want once", starts)
	}
	var got []uint32
	if err := q.Drain(func(f *Control) error { got = append(got, f.Val); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0] != 0 || got[2] != 2 {
		t.Fatalf("drained %v", got)
	}
	if q.More(nil) {
		t.Fatal("More with nothing queued")
	}
	// The flusher ended: the next push starts another.
	if start, _ := q.Push(Control{Kind: PingAck}, nil); !start {
		t.Fatal("no flusher started after the last one ended")
	}
	if _, _ = q.Push(Control{Kind: PingAck}, nil); !q.More(nil) {
		t.Fatal("More false with frames queued")
	}
}

func TestControlQueue_FullWhenTheBatchInWritingAndTheQueueReachTheBound(t *testing.T) {
	var q ControlQueue
	q.Push(Control{}, nil)
	// A writer took the batch and is stalled on the socket inside write.
	q.Drain(func(*Control) error {
		for i := 1; i < MaxQueuedControlFrames; i++ {
			if _, full := q.Push(Control{}, nil); full {
				t.Fatalf("full at %d frames", i+1)
			}
		}
		if _, full := q.Push(Control{}, nil); !full {
			t.Fatalf("not full at %d frames, the batch in writing counted", MaxQueuedControlFrames+1)
		}
		return nil
	})
}

func TestControlQueue_AnErrorDropsWhatWaitsAndCloseStopsPushes(t *testing.T) {
	var q ControlQueue
	q.Push(Control{Val: 1}, nil)
	q.Push(Control{Val: 2}, nil)
	failed := errors.New("socket closed")
	n := 0
	if err := q.Drain(func(*Control) error { n++; return failed }); err != failed || n != 1 {
		t.Fatalf("Drain: %v after %d writes, want the first write's error", err, n)
	}
	q.Push(Control{Val: 3}, nil)
	if q.More(failed) {
		t.Fatal("More true after an error")
	}
	if err := q.Drain(func(*Control) error { t.Fatal("a frame survived the error"); return nil }); err != nil {
		t.Fatal(err)
	}
	q.Close()
	if start, full := q.Push(Control{}, nil); start || full {
		t.Fatalf("push after Close: start %v full %v", start, full)
	}
	if q.queued.Load() != 0 {
		t.Fatal("a push after Close queued a frame")
	}
}
