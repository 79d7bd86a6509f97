package cpu

import (
	"fmt"
	"runtime/debug"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
)

// Weights on the CPU are views of the model file's mapping (the loader
// passes block types through untouched), so every op that reads one can
// touch a page the file no longer has when the file was truncated or
// rewritten while the model is loaded: a SIGBUS, fatal to the process. The
// ops that read weights therefore run with debug.SetPanicOnFault on the
// calling goroutine (worker 0), which turns the fault into a panic that
// recoverFault makes the op's error; the pool's helpers keep the setting
// on for their whole life and hand their faults back through parallel. The
// error wraps a *gguf.FaultError (errors.Is gguf.ErrMappingFault) and names
// the op and the weight; the owner of the file can add the file offset
// (gguf.File.Locate).
//
// Usage, at the top of an op, after taking b.mu:
//
//	defer recoverFault(&err, debug.SetPanicOnFault(true), "matmul", w)

// recoverFault is deferred by the ops: it puts back the goroutine's fault
// setting (old) and turns a memory fault of the op into *err. Any other
// panic is a bug and goes on.
func recoverFault(err *error, old bool, op string, w *kernels.Weight) {
	debug.SetPanicOnFault(old)
	r := recover()
	if r == nil {
		return
	}
	fe, ok := gguf.AsFault(r)
	if !ok {
		panic(r)
	}
	*err = opFault(op, w, fe)
}

// opFault wraps the fault of op (reading w, if known) with their names.
func opFault(op string, w *kernels.Weight, err error) error {
	if w != nil {
		return fmt.Errorf("cpu: %s: weight %q: %w", op, w.Name, err)
	}
	return fmt.Errorf("cpu: %s: %w", op, err)
}
