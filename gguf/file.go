package gguf

import (
	"fmt"
)

// Tensor finds a tensor by name.
func (f *File) Tensor(name string) (*TensorInfo, bool) {
	i, ok := f.tensorIndex[name]
	if !ok {
		return nil, false
	}
	return &f.Tensors[i], true
}

// TensorData returns the tensor's bytes as a view into the mapping: no copy,
// and the pages are read from disk only when touched. The view is valid
// until Close. Touching it after the file shrank faults (SIGBUS) and kills
// the process: code that must survive a file changed under it copies out of
// the view with CopyMapped, uses ReadTensor, or reads the view inside
// CatchFault (or on a goroutine with debug.SetPanicOnFault on, turning what
// it recovers into an error with AsFault); Check tells beforehand whether
// the file still is what was mapped.
func (f *File) TensorData(t *TensorInfo) ([]byte, error) {
	if f.mmap == nil {
		return nil, fmt.Errorf("gguf: %s: tensor %q: file was opened without mmap; use ReadTensor", f.Path, t.Name)
	}
	start, end, err := f.span(t, 0, t.Size)
	if err != nil {
		return nil, err
	}
	return f.mmap[start:end:end], nil
}

// span returns the absolute byte range [start, end) of tensor bytes
// [off, off+n), checked against the tensor and the mapping.
func (f *File) span(t *TensorInfo, off, n uint64) (int64, int64, error) {
	if off > t.Size || n > t.Size-off {
		return 0, 0, fmt.Errorf("gguf: %s: tensor %q: range [%d, %d) outside its %d bytes", f.Path, t.Name, off, off+n, t.Size)
	}
	start := f.DataOffset + int64(t.Offset) + int64(off)
	end := start + int64(n)
	if end > f.Size {
		return 0, 0, fmt.Errorf("gguf: %s: tensor %q: range [%d, %d) past the end of the file", f.Path, t.Name, start, end)
	}
	return start, end, nil
}

// ReadTensor copies tensor bytes [off, off+len(dst)) into dst. From a mapped
// file it copies out of the mapping with faults turned into errors, so a
// file truncated or replaced while open gives an error here instead of
// killing the process with SIGBUS; without a mapping it uses ReadAt.
func (f *File) ReadTensor(t *TensorInfo, off uint64, dst []byte) error {
	start, end, err := f.span(t, off, uint64(len(dst)))
	if err != nil {
		return err
	}
	if f.mmap == nil {
		if k, err := f.src.ReadAt(dst, start); k < len(dst) {
			return fmt.Errorf("gguf: %s: tensor %q: read at offset %d: %w", f.Path, t.Name, start, err)
		}
		return nil
	}
	if err := CopyMapped(dst, f.mmap[start:end]); err != nil {
		f.Locate(err)
		return fmt.Errorf("gguf: %s: tensor %q: read at offset %d: %w", f.Path, t.Name, start, err)
	}
	return nil
}

// CopyMapped copies src (memory-mapped) into dst like copy, but returns a
// *FaultError instead of crashing if touching src faults, which is what
// happens when the file under a mapping is truncated (SIGBUS) or an I/O
// error hits a page. It is exported for the loader, which copies views
// itself.
func CopyMapped(dst, src []byte) error {
	return CatchFault(func() { copy(dst, src) })
}

// Lookup finds a metadata value by key.
func (f *File) Lookup(key string) (Value, bool) {
	i, ok := f.kvIndex[key]
	if !ok {
		return Value{}, false
	}
	return f.Metadata[i].Value, true
}

// String returns a string value.
func (f *File) String(key string) (string, bool) {
	v, ok := f.Lookup(key)
	if !ok {
		return "", false
	}
	return v.Text()
}

// Uint returns a non-negative integer value of any integer type.
func (f *File) Uint(key string) (uint64, bool) {
	v, ok := f.Lookup(key)
	if !ok {
		return 0, false
	}
	return v.Uint()
}

// Int returns an integer value of any integer type that fits in int64.
func (f *File) Int(key string) (int64, bool) {
	v, ok := f.Lookup(key)
	if !ok {
		return 0, false
	}
	return v.Int()
}

// Float returns a float32 or float64 value.
func (f *File) Float(key string) (float64, bool) {
	v, ok := f.Lookup(key)
	if !ok {
		return 0, false
	}
	return v.Float()
}

// Bool returns a bool value.
func (f *File) Bool(key string) (bool, bool) {
	v, ok := f.Lookup(key)
	if !ok {
		return false, false
	}
	return v.Bool()
}

// Array returns an array value.
func (f *File) Array(key string) (*Array, bool) {
	v, ok := f.Lookup(key)
	if !ok {
		return nil, false
	}
	return v.Array()
}

// Strings decodes an array of strings (one read, decoded on each call: keep
// the result rather than calling it in a loop).
func (f *File) Strings(key string) ([]string, bool) {
	a, ok := f.Array(key)
	if !ok {
		return nil, false
	}
	s, err := a.Strings()
	return s, err == nil
}

// Float32s decodes an array of float32.
func (f *File) Float32s(key string) ([]float32, bool) {
	a, ok := f.Array(key)
	if !ok {
		return nil, false
	}
	s, err := a.Float32s()
	return s, err == nil
}

// Int32s decodes an array of integers that fit in int32.
func (f *File) Int32s(key string) ([]int32, bool) {
	a, ok := f.Array(key)
	if !ok {
		return nil, false
	}
	s, err := a.Int32s()
	return s, err == nil
}

// FileOffset is the absolute file offset of the tensor's first byte, for
// readers that bypass the mapping (pread, O_DIRECT).
func (f *File) FileOffset(t *TensorInfo) int64 { return f.DataOffset + int64(t.Offset) }

// Mapped returns the whole mapping (nil for a file opened without mmap), for
// callers that hand the mapped range to a device API at once, such as
// registering it as pinned host memory. The same fault caveat as TensorData
// applies.
func (f *File) Mapped() []byte { return f.mmap }
