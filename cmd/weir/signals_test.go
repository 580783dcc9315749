package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/weirproxy/weir/sdk/abi"
	"github.com/weirproxy/weir/sdk/plan"
)

// readings counts what a recordedSource records.
type readings struct{ reads, failures, moved int }

func (r *readings) SignalsRead(_ time.Duration, err error) {
	r.reads++
	if err != nil {
		r.failures++
	}
}

func (r *readings) SignalsMoved(n int) { r.moved += n }

// failingSource fails every reading with err, or returns nothing.
type failingSource struct{ err error }

func (f failingSource) Signals(context.Context, []*plan.Service) ([][]abi.Signals, error) {
	return nil, f.err
}

// TestRecordedSource records each reading and its failure, but not one
// its context ended.
func TestRecordedSource(t *testing.T) {
	rec := &readings{}
	ctx := context.Background()
	_, _ = recordedSource{SignalSource: failingSource{}, rec: rec}.Signals(ctx, nil)
	_, _ = recordedSource{SignalSource: failingSource{err: errors.New("netlink")}, rec: rec}.Signals(ctx, nil)
	done, cancel := context.WithCancel(ctx)
	cancel()
	_, _ = recordedSource{SignalSource: failingSource{err: context.Canceled}, rec: rec}.Signals(done, nil)
	if *rec != (readings{reads: 2, failures: 1}) {
		t.Errorf("recorded %+v, want 2 readings, 1 failed", *rec)
	}
}
