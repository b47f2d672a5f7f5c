package e2e

import (
	"context"
	"slices"

	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
)

// fakes drives every fakeinference worker of a fleet as one: holds go to
// each, counters add up, and call logs merge in arrival order. A rollout's
// calls stay on one worker (the model server's affinity), so a hold per
// rollout means on several workers what it means on one.
type fakes []*fakeinference.Control

// HoldAfterCallsPerRollout holds each rollout's calls after its first n,
// on every worker.
func (fs fakes) HoldAfterCallsPerRollout(ctx context.Context, n int) (int, error) {
	held := 0
	for _, f := range fs {
		rep, err := f.HoldAfterCallsPerRollout(ctx, n)
		if err != nil {
			return held, err
		}
		held += rep.Held
	}
	return held, nil
}

// HoldAfterCalls holds every call after the first n each worker admits,
// on every worker (with n 0: every call, wherever it lands).
func (fs fakes) HoldAfterCalls(ctx context.Context, n int) (int, error) {
	held := 0
	for _, f := range fs {
		rep, err := f.HoldAfterCalls(ctx, n)
		if err != nil {
			return held, err
		}
		held += rep.Held
	}
	return held, nil
}

// Release releases every held call of every worker and removes the holds.
func (fs fakes) Release(ctx context.Context) (int, error) {
	n := 0
	for _, f := range fs {
		k, err := f.Release(ctx)
		if err != nil {
			return n, err
		}
		n += k
	}
	return n, nil
}

// ReleaseCalls releases k held calls and keeps the holds: the oldest of
// the first worker holding any, then of the next. (The oldest across
// workers only with one worker.)
func (fs fakes) ReleaseCalls(ctx context.Context, k int) (int, error) {
	n := 0
	for _, f := range fs {
		if n == k {
			break
		}
		c, err := f.CallCount(ctx)
		if err != nil {
			return n, err
		}
		if c.Held == 0 {
			continue
		}
		got, err := f.ReleaseCalls(ctx, min(k-n, c.Held))
		if err != nil {
			return n, err
		}
		n += got
	}
	return n, nil
}

// CallCount adds up every worker's counters.
func (fs fakes) CallCount(ctx context.Context) (fakeinference.CallCount, error) {
	var sum fakeinference.CallCount
	for _, f := range fs {
		c, err := f.CallCount(ctx)
		if err != nil {
			return sum, err
		}
		sum.Received += c.Received
		sum.Returned += c.Returned
		sum.Failed += c.Failed
		sum.Cut += c.Cut
		sum.Held += c.Held
		sum.InFlight += c.InFlight
	}
	return sum, nil
}

// Calls is every worker's call log, merged in arrival order.
func (fs fakes) Calls(ctx context.Context) ([]fakeinference.CallInfo, error) {
	var all []fakeinference.CallInfo
	for _, f := range fs {
		calls, err := f.Calls(ctx)
		if err != nil {
			return nil, err
		}
		all = append(all, calls...)
	}
	slices.SortStableFunc(all, func(a, b fakeinference.CallInfo) int { return a.ReceivedAt.Compare(b.ReceivedAt) })
	return all, nil
}

// Cuts is every worker's generation-cut requests (each worker's in order).
func (fs fakes) Cuts(ctx context.Context) ([][]string, error) {
	var all [][]string
	for _, f := range fs {
		rounds, err := f.Cuts(ctx)
		if err != nil {
			return nil, err
		}
		all = append(all, rounds...)
	}
	return all, nil
}
