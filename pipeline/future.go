package pipeline

import (
	"context"

	"github.com/forge-llm/forge/actors"
)

// Future is the readiness of part of a model's weights: the globals a
// request starts on (Model.Ready), one block (Model.Layer) or all of them
// (Model.Resident). It resolves once they are resident or fails with why
// they never will be, so waiting never hangs. It is pipeline's own type so
// that a caller needs no other package to wait for a model.
type Future struct{ f *actors.Future }

// Name is the part it stands for ("ready", "layer 3", "all resident").
func (f *Future) Name() string { return f.f.Name() }

// State is where the part stands, and the error once it failed.
func (f *Future) State() (UnitState, error) {
	st, err := f.f.State()
	return unitState(st), err
}

// Done is closed once the part is resident or failed.
func (f *Future) Done() <-chan struct{} { return f.f.Done() }

// Err is why the part failed (nil while pending or once resident).
func (f *Future) Err() error { return f.f.Err() }

// Wait returns once the part is resident (nil), failed (its error) or ctx
// is done (ctx's error).
func (f *Future) Wait(ctx context.Context) error { return f.f.Wait(ctx) }

// UnitState is where part of a model's weights stands. It only moves
// forward: UnitPending → UnitEnqueued → UnitResident, or to UnitFailed
// from either of the first two.
type UnitState int32

// The states of a Future, in the order they are reached.
const (
	// UnitPending: nothing of the part is on its way to the device yet.
	UnitPending UnitState = iota
	// UnitEnqueued: every copy is queued (on a GPU the kernels may run
	// after them on the same stream).
	UnitEnqueued
	// UnitResident: the weights are usable.
	UnitResident
	// UnitFailed: the part will never arrive; Err says why.
	UnitFailed
)

// actorsStates maps each UnitState onto the state package actors keeps,
// by name, so the two lists cannot drift apart silently.
var actorsStates = [...]actors.State{
	UnitPending:  actors.Pending,
	UnitEnqueued: actors.Enqueued,
	UnitResident: actors.Resident,
	UnitFailed:   actors.Failed,
}

// unitState is st as a UnitState.
func unitState(st actors.State) UnitState {
	for s, as := range actorsStates {
		if as == st {
			return UnitState(s)
		}
	}
	return UnitState(st) // unknown: String names it State(N)
}

func (s UnitState) String() string {
	if s >= 0 && int(s) < len(actorsStates) {
		return actorsStates[s].String()
	}
	return actors.State(s).String()
}
