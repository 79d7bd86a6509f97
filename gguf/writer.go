package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// Writer streams a GGUF v3 file: declare metadata and tensors, write the
// header, then each tensor's bytes in declaration order. Tensor data goes
// straight to the output, so a file of any size is written with memory for
// the header only. See the package documentation for an example.
type Writer struct {
	out   io.Writer
	bw    *bufio.Writer
	kvs   []KV
	keys  map[string]bool
	ts    []TensorInfo
	names map[string]bool
	align uint64

	headerDone bool
	dataOffset int64 // fixed by WriteHeader
	next       int   // index of the next tensor whose data is due
	pos        int64 // logical bytes written (skipped bytes included)
	skipped    bool  // the output ends in a hole made by Seek
	err        error // first error: the writer is unusable after it
}

// NewWriter returns a Writer on out. If out is also an io.Seeker,
// SkipTensorData leaves holes instead of writing zeros (sparse files); if it
// has Truncate(int64) error (an *os.File), Close extends the file over a
// trailing hole.
func NewWriter(out io.Writer) *Writer {
	return &Writer{out: out, bw: bufio.NewWriterSize(out, 64<<10), keys: map[string]bool{}, names: map[string]bool{}, align: DefaultAlignment}
}

func (w *Writer) fail(err error) error {
	if w.err == nil {
		w.err = err
	}
	return err
}

// AddKV declares a metadata entry. Keys must be unique. general.alignment
// (an unsigned integer, a power of two) also sets the data alignment.
func (w *Writer) AddKV(key string, v Value) error {
	if w.err != nil {
		return w.err
	}
	if w.headerDone {
		return w.fail(fmt.Errorf("gguf: writer: metadata %q added after WriteHeader", key))
	}
	if w.keys[key] {
		return w.fail(fmt.Errorf("gguf: writer: duplicate key %q", key))
	}
	if !v.Type.Valid() || (v.Type == ValueArray && v.arr == nil) {
		return w.fail(fmt.Errorf("gguf: writer: metadata %q: invalid value", key))
	}
	if key == "general.alignment" {
		a, ok := v.Uint()
		if !ok || a == 0 || a&(a-1) != 0 || a > maxAlignment {
			return w.fail(fmt.Errorf("gguf: writer: general.alignment %v is not a power of two", v))
		}
		if len(w.ts) > 0 {
			return w.fail(fmt.Errorf("gguf: writer: general.alignment must be set before the first tensor"))
		}
		w.align = a
	}
	w.keys[key] = true
	w.kvs = append(w.kvs, KV{Key: key, Value: v})
	return nil
}

// Typed shorthands for AddKV.

func (w *Writer) AddString(key, v string) error          { return w.AddKV(key, Str(v)) }
func (w *Writer) AddUint32(key string, v uint32) error   { return w.AddKV(key, Uint32(v)) }
func (w *Writer) AddInt32(key string, v int32) error     { return w.AddKV(key, Int32(v)) }
func (w *Writer) AddUint64(key string, v uint64) error   { return w.AddKV(key, Uint64(v)) }
func (w *Writer) AddFloat32(key string, v float32) error { return w.AddKV(key, Float32(v)) }
func (w *Writer) AddBool(key string, v bool) error       { return w.AddKV(key, Bool(v)) }
func (w *Writer) AddStrings(key string, v []string) error {
	return w.AddKV(key, ArrayOf(v))
}
func (w *Writer) AddFloat32s(key string, v []float32) error { return w.AddKV(key, ArrayOf(v)) }
func (w *Writer) AddInt32s(key string, v []int32) error     { return w.AddKV(key, ArrayOf(v)) }

// AddTensor declares a tensor; dims in ggml order (row length first). Its
// data offset follows the previous tensor, aligned.
func (w *Writer) AddTensor(name string, typ Type, dims ...uint64) error {
	if w.err != nil {
		return w.err
	}
	if w.headerDone {
		return w.fail(fmt.Errorf("gguf: writer: tensor %q added after WriteHeader", name))
	}
	if w.names[name] {
		return w.fail(fmt.Errorf("gguf: writer: duplicate tensor %q", name))
	}
	if len(dims) == 0 || len(dims) > maxDims {
		return w.fail(fmt.Errorf("gguf: writer: tensor %q: %d dims, want 1 to %d", name, len(dims), maxDims))
	}
	if !typ.Valid() {
		return w.fail(fmt.Errorf("gguf: writer: tensor %q: unknown type %d", name, uint32(typ)))
	}
	n := uint64(1)
	for _, d := range dims {
		if d == 0 {
			return w.fail(fmt.Errorf("gguf: writer: tensor %q: zero dim in %v", name, dims))
		}
		if n > math.MaxInt64/d {
			return w.fail(fmt.Errorf("gguf: writer: tensor %q: element count of %v overflows", name, dims))
		}
		n *= d
	}
	if dims[0]%uint64(typ.BlockSize()) != 0 {
		return w.fail(fmt.Errorf("gguf: writer: tensor %q: row length %d is not a multiple of the %v block size %d", name, dims[0], typ, typ.BlockSize()))
	}
	size, err := typ.RowBytes(n)
	if err != nil {
		return w.fail(fmt.Errorf("gguf: writer: tensor %q: %w", name, err))
	}
	var off uint64
	if k := len(w.ts); k > 0 {
		off = alignUp(w.ts[k-1].Offset+w.ts[k-1].Size, w.align)
	}
	w.names[name] = true
	w.ts = append(w.ts, TensorInfo{Name: name, Dims: append([]uint64(nil), dims...), Type: typ, Offset: off, Size: size})
	return nil
}

func alignUp(n, a uint64) uint64 { return (n + a - 1) / a * a }

// Tensors returns the declared tensors with their offsets and sizes.
func (w *Writer) Tensors() []TensorInfo { return w.ts }

// DataOffset is where the data section starts. Before WriteHeader it
// measures the header declared so far (encoding in-memory arrays to do so).
func (w *Writer) DataOffset() int64 {
	if w.headerDone {
		return w.dataOffset
	}
	return int64(alignUp(uint64(w.headerSize()), w.align))
}

// FileSize is the size of the finished file: header, then every tensor
// padded to the alignment, as llama.cpp writes it.
func (w *Writer) FileSize() int64 {
	end := uint64(w.DataOffset())
	if k := len(w.ts); k > 0 {
		end += alignUp(w.ts[k-1].Offset+w.ts[k-1].Size, w.align)
	}
	return int64(end)
}

func (w *Writer) headerSize() int64 {
	n := int64(4 + 4 + 8 + 8)
	for _, kv := range w.kvs {
		n += 8 + int64(len(kv.Key)) + 4 + valueSize(kv.Value)
	}
	for _, t := range w.ts {
		n += 8 + int64(len(t.Name)) + 4 + 8*int64(len(t.Dims)) + 4 + 8
	}
	return n
}

func valueSize(v Value) int64 {
	if n := v.Type.fixedSize(); n > 0 {
		return int64(n)
	}
	if v.Type == ValueString {
		return 8 + int64(len(v.str))
	}
	n, _ := v.arr.encodedSize()
	return 4 + 8 + n
}

// WriteHeader writes the header: magic, version 3, counts, metadata, tensor
// infos and the padding up to the data section.
func (w *Writer) WriteHeader() error {
	if w.err != nil {
		return w.err
	}
	if w.headerDone {
		return w.fail(errors.New("gguf: writer: WriteHeader called twice"))
	}
	w.dataOffset = w.DataOffset()
	w.headerDone = true
	le := binary.LittleEndian
	b := make([]byte, 0, 64)
	b = append(b, Magic...)
	b = le.AppendUint32(b, 3)
	b = le.AppendUint64(b, uint64(len(w.ts)))
	b = le.AppendUint64(b, uint64(len(w.kvs)))
	if err := w.write(b); err != nil {
		return err
	}
	for _, kv := range w.kvs {
		b = appendString(b[:0], kv.Key)
		b = le.AppendUint32(b, uint32(kv.Value.Type))
		if err := w.write(b); err != nil {
			return err
		}
		if err := w.writeValue(kv.Value); err != nil {
			return w.fail(fmt.Errorf("gguf: writer: metadata %q: %w", kv.Key, err))
		}
	}
	for _, t := range w.ts {
		b = appendString(b[:0], t.Name)
		b = le.AppendUint32(b, uint32(len(t.Dims)))
		for _, d := range t.Dims {
			b = le.AppendUint64(b, d)
		}
		b = le.AppendUint32(b, uint32(t.Type))
		b = le.AppendUint64(b, t.Offset)
		if err := w.write(b); err != nil {
			return err
		}
	}
	return w.padTo(w.DataOffset())
}

func appendString(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint64(b, uint64(len(s)))
	return append(b, s...)
}

func (w *Writer) writeValue(v Value) error {
	if n := v.Type.fixedSize(); n > 0 {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], v.bits)
		return w.write(b[:n])
	}
	if v.Type == ValueString {
		return w.write(appendString(nil, v.str))
	}
	raw, err := v.arr.raw()
	if err != nil {
		return err
	}
	b := binary.LittleEndian.AppendUint32(nil, uint32(v.arr.Elem))
	b = binary.LittleEndian.AppendUint64(b, v.arr.Len)
	if err := w.write(b); err != nil {
		return err
	}
	return w.write(raw)
}

func (w *Writer) write(p []byte) error {
	if w.err != nil {
		return w.err
	}
	if w.skipped {
		// Bytes after a hole: the hole was made with Seek on out directly.
		w.skipped = false
	}
	n, err := w.bw.Write(p)
	w.pos += int64(n)
	if err != nil {
		return w.fail(fmt.Errorf("gguf: writer: %w", err))
	}
	return nil
}

var zeros [4096]byte

// padTo writes zero bytes up to absolute offset end.
func (w *Writer) padTo(end int64) error {
	for w.pos < end {
		if err := w.write(zeros[:min(int64(len(zeros)), end-w.pos)]); err != nil {
			return err
		}
	}
	return nil
}

// due checks that name is the next tensor whose data is expected and pads
// up to its offset.
func (w *Writer) due(name string) (*TensorInfo, error) {
	if w.err != nil {
		return nil, w.err
	}
	if !w.headerDone {
		return nil, w.fail(fmt.Errorf("gguf: writer: tensor %q data before WriteHeader", name))
	}
	if w.next >= len(w.ts) {
		return nil, w.fail(fmt.Errorf("gguf: writer: tensor %q: all declared tensors already written", name))
	}
	t := &w.ts[w.next]
	if t.Name != name {
		return nil, w.fail(fmt.Errorf("gguf: writer: tensor %q written out of order, %q is due", name, t.Name))
	}
	if err := w.padTo(w.DataOffset() + int64(t.Offset)); err != nil {
		return nil, err
	}
	return t, nil
}

// WriteTensorData writes the whole data of the next tensor.
func (w *Writer) WriteTensorData(name string, data []byte) error {
	t, err := w.due(name)
	if err != nil {
		return err
	}
	if uint64(len(data)) != t.Size {
		return w.fail(fmt.Errorf("gguf: writer: tensor %q: %d bytes, want %d", name, len(data), t.Size))
	}
	w.next++
	return w.write(data)
}

// WriteTensorFrom streams the next tensor's data from r, which must yield
// exactly the tensor's size in bytes (more is left unread).
func (w *Writer) WriteTensorFrom(name string, r io.Reader) error {
	t, err := w.due(name)
	if err != nil {
		return err
	}
	n, err := io.CopyN(w.bw, r, int64(t.Size))
	w.pos += n
	if err != nil {
		return w.fail(fmt.Errorf("gguf: writer: tensor %q: %d of %d bytes: %w", name, n, t.Size, err))
	}
	w.next++
	return nil
}

// SkipTensorData leaves the next tensor's bytes as zeros. On an io.Seeker
// it seeks past them, so the file gets a hole and takes no disk space: how
// tests make 100 GB files in a temporary directory.
func (w *Writer) SkipTensorData(name string) error {
	t, err := w.due(name)
	if err != nil {
		return err
	}
	w.next++
	s, ok := w.out.(io.Seeker)
	if !ok {
		return w.padTo(w.pos + int64(t.Size))
	}
	if err := w.bw.Flush(); err != nil {
		return w.fail(fmt.Errorf("gguf: writer: %w", err))
	}
	if _, err := s.Seek(int64(t.Size), io.SeekCurrent); err != nil {
		return w.fail(fmt.Errorf("gguf: writer: tensor %q: seek: %w", name, err))
	}
	w.pos += int64(t.Size)
	w.skipped = true
	return nil
}

// Close checks that every tensor was written, writes the final padding and
// flushes. It does not close the underlying writer.
func (w *Writer) Close() error {
	if w.err != nil {
		return w.err
	}
	if !w.headerDone {
		if err := w.WriteHeader(); err != nil {
			return err
		}
	}
	if w.next < len(w.ts) {
		return w.fail(fmt.Errorf("gguf: writer: closed with %d of %d tensors unwritten (next %q)", len(w.ts)-w.next, len(w.ts), w.ts[w.next].Name))
	}
	end := w.FileSize()
	if w.skipped {
		if tr, ok := w.out.(interface{ Truncate(int64) error }); ok {
			// Extend the file over the trailing hole and the padding.
			if err := tr.Truncate(end); err != nil {
				return w.fail(fmt.Errorf("gguf: writer: truncate: %w", err))
			}
			w.pos = end
		} else if s, ok := w.out.(io.Seeker); ok && w.pos == end {
			// No Truncate: rewrite the last byte of the hole so the file
			// reaches its full length.
			if _, err := s.Seek(-1, io.SeekCurrent); err != nil {
				return w.fail(fmt.Errorf("gguf: writer: seek: %w", err))
			}
			w.pos--
		}
	}
	if err := w.padTo(end); err != nil {
		return err
	}
	if err := w.bw.Flush(); err != nil {
		return w.fail(fmt.Errorf("gguf: writer: %w", err))
	}
	w.err = errors.New("gguf: writer: closed")
	return nil
}
