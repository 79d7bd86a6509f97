package pipeline

// LoadedModel is a loaded model as an observer (the server's metrics)
// sees it.
type LoadedModel struct {
	ID    string
	Model *Model
}

// Loaded lists the models whose Open has returned, in no order. Unlike
// Acquire it is not a use: it loads nothing and touches no keep-alive or
// eviction order, so a metrics scrape changes nothing it measures. A
// model listed may be closed by the time the caller reads it; its
// read-only accessors (BatchStats, Memory, Resident) stay safe.
func (e *Engine) Loaded() []LoadedModel {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []LoadedModel
	for _, ent := range e.models {
		inst := ent.inst
		if inst == nil {
			continue
		}
		select {
		case <-inst.opened:
			if inst.m != nil {
				out = append(out, LoadedModel{ID: ent.id, Model: inst.m})
			}
		default:
		}
	}
	return out
}
