package actors

import "context"

// Hooks let tests and benchmarks slow the pipeline down or inject faults
// at the stages where real ones happen. Nil hooks cost nothing.
type Hooks struct {
	// Read runs on a reader before it reads bytes [off, off+n) of a tensor;
	// it may sleep (a slow disk; it must return when ctx is done) or return
	// an error (an unreadable range).
	// A mixture's stacked expert tensor is read expert by expert: off
	// counts from the tensor's start, so expert e's rows are the range
	// [e·Size/Experts, (e+1)·Size/Experts).
	Read func(ctx context.Context, tensor string, off, n int64) error
	// Upload runs on the uploader before each chunk of a tensor is
	// uploaded; an error is a failed upload.
	Upload func(tensor string) error
}
