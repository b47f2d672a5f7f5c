package environment

import (
	"context"
	"errors"
	"testing"
)

func TestCPUGate(t *testing.T) {
	g := make(cpuGate, 2)
	ctx := context.Background()
	for range 2 {
		if err := g.enter(ctx); err != nil {
			t.Fatal(err)
		}
	}
	full, cancel := context.WithCancelCause(ctx)
	cause := errors.New("client went away")
	cancel(cause)
	if err := g.enter(full); !errors.Is(err, cause) {
		t.Fatalf("enter on a full gate with an ended context = %v, want its cause", err)
	}
	entered := make(chan struct{})
	go func() {
		defer close(entered)
		if err := g.enter(ctx); err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-entered:
		t.Fatal("a third handler entered a gate of two")
	default:
	}
	g.leave()
	<-entered
	g.leave()
	g.leave()
	if len(g) != 0 {
		t.Errorf("%d slots still taken", len(g))
	}
	if cap(newCPUGate()) < 2 {
		t.Error("the server's gate admits fewer than two handlers")
	}
}
