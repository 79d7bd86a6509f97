package actors

import "fmt"

// Strategy is how weights get to the device.
type Strategy int

const (
	// Prefetch streams every unit in priority order and runs requests as
	// soon as the model is ready, each layer waiting on its own future.
	Prefetch Strategy = iota
	// Eager streams every unit the same way but starts requests only once
	// all are resident.
	Eager
	// Lazy loads the globals, then a layer only when the executor first
	// needs it (no prefetch); concurrent first uses load it once. An
	// expert unit loads only when a request's router picks it
	// (WaitExpert), so a mixture is never all resident: System.Resident
	// resolves only when Close fails what never loaded.
	Lazy
	// HostF32 dequantizes every tensor to F32 on the host, one allocation
	// per tensor, and starts once all are resident: the design forge
	// replaces, kept for comparison.
	HostF32
)

// Strategies lists every strategy in the order of their names.
var Strategies = []Strategy{Prefetch, Eager, Lazy, HostF32}

func (s Strategy) String() string {
	switch s {
	case Prefetch:
		return "prefetch"
	case Eager:
		return "eager"
	case Lazy:
		return "lazy"
	case HostF32:
		return "host-f32"
	}
	return fmt.Sprintf("Strategy(%d)", int(s))
}

// ParseStrategy reads a strategy's name ("" is Prefetch).
func ParseStrategy(name string) (Strategy, error) {
	if name == "" {
		return Prefetch, nil
	}
	for _, s := range Strategies {
		if s.String() == name {
			return s, nil
		}
	}
	return 0, fmt.Errorf("unknown load strategy %q (prefetch, eager, lazy, host-f32)", name)
}

// waitsForAll reports whether requests start only once every unit is
// resident.
func (s Strategy) waitsForAll() bool { return s == Eager || s == HostF32 }
