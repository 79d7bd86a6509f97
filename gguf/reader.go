package gguf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"sort"
	"time"

	"github.com/edsrzf/mmap-go"
)

// Magic is the first four bytes of every GGUF file.
const Magic = "GGUF"

// DefaultAlignment is the data alignment when general.alignment is absent.
const DefaultAlignment = 32

// Limits that keep a hostile header from making Open allocate or recurse
// without bound. Real files stay far below them: ggml caps tensor names at
// 64 bytes and chat templates are tens of kilobytes.
const (
	maxDims        = 4       // GGML_MAX_DIMS
	maxNameLen     = 1 << 16 // tensor names and keys
	maxStringLen   = 1 << 28 // scalar string values (256 MiB)
	maxArrayDepth  = 8       // arrays of arrays of …
	maxAlignment   = 1 << 30
	headerChunk    = 64 << 10 // header bytes read per ReadAt
	minKVBytes     = 8 + 4 + 1
	minTensorBytes = 8 + 4 + 8 + 4 + 8
)

// File is an open GGUF file: its header decoded, its tensor data left in
// the file (mapped, for files opened with Open) until asked for. Its fields
// are read-only after Open, and every method only reads, so a File may be
// used from many goroutines at once.
type File struct {
	Path       string
	Version    uint32
	Size       int64  // file size in bytes
	Alignment  uint64 // general.alignment, or DefaultAlignment
	DataOffset int64  // absolute offset of the data section
	Metadata   []KV   // file order
	Tensors    []TensorInfo

	kvIndex     map[string]int
	tensorIndex map[string]int

	src  io.ReaderAt // reads the header and lazy arrays
	osf  *os.File    // non-nil when opened by Open
	mmap mmap.MMap   // the whole file, when opened by Open

	modTime time.Time // when opened by Open: the modification time Check compares
}

// TensorInfo describes one tensor. Dims are in ggml order: Dims[0] is the
// row length (the fastest-varying index), so a [vocab, embd] matrix in
// PyTorch terms is Dims = {embd, vocab}.
type TensorInfo struct {
	Name   string
	Dims   []uint64
	Type   Type
	Offset uint64 // relative to File.DataOffset
	Size   uint64 // bytes, from Type and Dims
}

// Elements is the number of elements (the product of Dims).
func (t *TensorInfo) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// Rows is the number of rows of Dims[0] elements.
func (t *TensorInfo) Rows() uint64 {
	if len(t.Dims) == 0 || t.Dims[0] == 0 {
		return 0
	}
	return t.Elements() / t.Dims[0]
}

// RowBytes is the byte length of one row.
func (t *TensorInfo) RowBytes() uint64 {
	n, _ := t.Type.RowBytes(t.Dims[0])
	return n
}

// Open maps the file read-only and decodes its header. Only the header is
// read (with pread, so a file truncated under us gives an error, not a
// fault); tensor data stays in the mapping until TensorData or ReadTensor.
func Open(path string) (*File, error) {
	osf, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	st, err := osf.Stat()
	if err != nil {
		osf.Close()
		return nil, fmt.Errorf("gguf: %w", err)
	}
	f, err := parse(osf, st.Size(), path)
	if err != nil {
		osf.Close()
		return nil, err
	}
	if st.Size() > 0 {
		m, err := mmap.Map(osf, mmap.RDONLY, 0)
		if err != nil {
			osf.Close()
			return nil, fmt.Errorf("gguf: %s: mmap: %w", path, err)
		}
		f.mmap = m
	}
	f.osf, f.modTime = osf, st.ModTime()
	return f, nil
}

// OpenReaderAt decodes the header of a GGUF file read through r, which must
// stay usable until the File is done with (tensor data and token lists are
// read from it on request). Nothing is mapped: TensorData returns an error,
// ReadTensor uses r.ReadAt.
func OpenReaderAt(r io.ReaderAt, size int64, name string) (*File, error) {
	return parse(r, size, name)
}

// Close unmaps and closes the file. Views from TensorData must not be used
// after Close.
func (f *File) Close() error {
	var errs []error
	if f.mmap != nil {
		errs = append(errs, f.mmap.Unmap())
		f.mmap = nil
	}
	if f.osf != nil {
		errs = append(errs, f.osf.Close())
		f.osf = nil
	}
	return errors.Join(errs...)
}

// FormatError is a header that breaks the GGUF rules. Offset is where in the
// file the offending field starts.
type FormatError struct {
	Path   string
	Offset int64
	Field  string
	Msg    string
}

func (e *FormatError) Error() string {
	return fmt.Sprintf("gguf: %s: offset %d: %s: %s", e.Path, e.Offset, e.Field, e.Msg)
}

// cursor reads the header sequentially through a ReaderAt in chunks.
type cursor struct {
	r      io.ReaderAt
	size   int64
	path   string
	pos    int64  // absolute offset of the next byte
	buf    []byte // file bytes [bufOff, bufOff+len(buf))
	bufOff int64
}

func (c *cursor) errf(at int64, field, format string, args ...any) error {
	return &FormatError{Path: c.path, Offset: at, Field: field, Msg: fmt.Sprintf(format, args...)}
}

func (c *cursor) remaining() int64 { return c.size - c.pos }

// bytes returns the next n bytes (n ≤ headerChunk) without copying where it
// can, and advances past them.
func (c *cursor) bytes(n int, field string) ([]byte, error) {
	if int64(n) > c.remaining() {
		return nil, c.errf(c.pos, field, "file ends after %d bytes, need %d more (truncated)", c.remaining(), n)
	}
	if c.pos < c.bufOff || c.pos+int64(n) > c.bufOff+int64(len(c.buf)) {
		want := max(int64(n), min(headerChunk, c.remaining()))
		if cap(c.buf) < int(want) {
			c.buf = make([]byte, want)
		}
		c.buf = c.buf[:want]
		if k, err := c.r.ReadAt(c.buf, c.pos); k < int(want) {
			if err == nil || err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			c.buf = c.buf[:0]
			return nil, c.errf(c.pos, field, "read: %v", err)
		}
		c.bufOff = c.pos
	}
	s := c.buf[c.pos-c.bufOff : c.pos-c.bufOff+int64(n)]
	c.pos += int64(n)
	return s, nil
}

func (c *cursor) u32(field string) (uint32, error) {
	b, err := c.bytes(4, field)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b), nil
}

func (c *cursor) u64(field string) (uint64, error) {
	b, err := c.bytes(8, field)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b), nil
}

// str reads a length-prefixed string of at most limit bytes.
func (c *cursor) str(field string, limit uint64) (string, error) {
	at := c.pos
	n, err := c.u64(field + " length")
	if err != nil {
		return "", err
	}
	if n > uint64(c.remaining()) {
		return "", c.errf(at, field, "string length %d runs past the end of the file (%d bytes left)", n, c.remaining())
	}
	if n > limit {
		return "", c.errf(at, field, "string length %d exceeds the limit of %d", n, limit)
	}
	if n <= headerChunk {
		b, err := c.bytes(int(n), field)
		return string(b), err
	}
	b := make([]byte, n)
	if k, err := c.r.ReadAt(b, c.pos); k < len(b) {
		return "", c.errf(c.pos, field, "read: %v", err)
	}
	c.pos += int64(n)
	return string(b), nil
}

// value reads a value of type t. Arrays are measured, not decoded.
func (c *cursor) value(t ValueType, field string, depth int) (Value, error) {
	at := c.pos
	if n := t.fixedSize(); n > 0 {
		b, err := c.bytes(n, field)
		if err != nil {
			return Value{}, err
		}
		if t == ValueBool && b[0] > 1 {
			return Value{}, c.errf(at, field, "bool value %d is neither 0 nor 1", b[0])
		}
		v, _, _ := decodeValue(b, t, nil, at, depth)
		return v, nil
	}
	switch t {
	case ValueString:
		s, err := c.str(field, maxStringLen)
		return Str(s), err
	case ValueArray:
		if depth >= maxArrayDepth {
			return Value{}, c.errf(at, field, "arrays nested deeper than %d", maxArrayDepth)
		}
		et, err := c.u32(field + " element type")
		if err != nil {
			return Value{}, err
		}
		elem := ValueType(et)
		if !elem.Valid() {
			return Value{}, c.errf(at, field, "unknown array element type %d", et)
		}
		countAt := c.pos
		count, err := c.u64(field + " array length")
		if err != nil {
			return Value{}, err
		}
		start := c.pos
		if n := elem.fixedSize(); n > 0 {
			if count > uint64(c.remaining())/uint64(n) {
				return Value{}, c.errf(countAt, field, "array of %d %v (%d bytes each) runs past the end of the file (%d bytes left)", count, elem, n, c.remaining())
			}
			if elem == ValueBool {
				// Check each byte, as for scalars, so decoded bools round-trip.
				for i := uint64(0); i < count; i += headerChunk {
					k := min(count-i, headerChunk)
					b, err := c.bytes(int(k), field)
					if err != nil {
						return Value{}, err
					}
					for j, x := range b {
						if x > 1 {
							return Value{}, c.errf(c.pos-int64(k)+int64(j), field, "bool array element %d is %d, neither 0 nor 1", i+uint64(j), x)
						}
					}
				}
			} else {
				c.pos += int64(count) * int64(n)
			}
		} else {
			// Strings: at least 8 bytes each; arrays: at least 12.
			minSize := uint64(8)
			if elem == ValueArray {
				minSize = 12
			}
			if count > uint64(c.remaining())/minSize {
				return Value{}, c.errf(countAt, field, "array of %d %v runs past the end of the file (%d bytes left)", count, elem, c.remaining())
			}
			lenField := field + " element length"
			for i := uint64(0); i < count; i++ {
				if elem == ValueString {
					lat := c.pos
					n, err := c.u64(lenField)
					if err != nil {
						return Value{}, err
					}
					if n > uint64(c.remaining()) {
						return Value{}, c.errf(lat, field, "string %d of %d: length %d runs past the end of the file (%d bytes left)", i, count, n, c.remaining())
					}
					c.pos += int64(n)
				} else if _, err := c.value(ValueArray, field, depth+1); err != nil {
					return Value{}, err
				}
			}
		}
		return Value{Type: ValueArray, arr: &Array{Elem: elem, Len: count, src: c.r, off: start, size: c.pos - start}}, nil
	}
	return Value{}, c.errf(at, field, "unknown value type %d", uint32(t))
}

// parse decodes and validates the header.
func parse(r io.ReaderAt, size int64, path string) (*File, error) {
	c := &cursor{r: r, size: size, path: path}
	f := &File{Path: path, Size: size, Alignment: DefaultAlignment, src: r}

	magic, err := c.bytes(4, "magic")
	if err != nil {
		return nil, err
	}
	if string(magic) != Magic {
		return nil, c.errf(0, "magic", "got %q, want %q: not a GGUF file", magic, Magic)
	}
	version, err := c.u32("version")
	if err != nil {
		return nil, err
	}
	switch {
	case version == 2 || version == 3:
	case version == 1:
		return nil, c.errf(4, "version", "GGUF version 1 is not supported (32-bit counts); convert the file with a current llama.cpp")
	case version&0xffff == 0 && version != 0 && bits.ReverseBytes32(version) <= 3:
		return nil, c.errf(4, "version", "big-endian GGUF (version %d byte-swapped) is not supported", bits.ReverseBytes32(version))
	default:
		return nil, c.errf(4, "version", "unsupported GGUF version %d (want 2 or 3)", version)
	}
	f.Version = version

	tcAt := c.pos
	tensorCount, err := c.u64("tensor count")
	if err != nil {
		return nil, err
	}
	kvAt := c.pos
	kvCount, err := c.u64("metadata count")
	if err != nil {
		return nil, err
	}
	if kvCount > uint64(c.remaining())/minKVBytes {
		return nil, c.errf(kvAt, "metadata count", "%d entries cannot fit in the %d bytes left (truncated or corrupt)", kvCount, c.remaining())
	}
	if tensorCount > uint64(c.remaining())/minTensorBytes {
		return nil, c.errf(tcAt, "tensor count", "%d tensors cannot fit in the %d bytes left (truncated or corrupt)", tensorCount, c.remaining())
	}

	f.Metadata = make([]KV, 0, min(kvCount, 1024))
	f.kvIndex = make(map[string]int, min(kvCount, 1024))
	for i := uint64(0); i < kvCount; i++ {
		at := c.pos
		key, err := c.str(fmt.Sprintf("metadata key %d", i), maxNameLen)
		if err != nil {
			return nil, err
		}
		if _, dup := f.kvIndex[key]; dup {
			return nil, c.errf(at, "metadata key", "duplicate key %q", key)
		}
		tAt := c.pos
		vt, err := c.u32(fmt.Sprintf("metadata %q type", key))
		if err != nil {
			return nil, err
		}
		if !ValueType(vt).Valid() {
			return nil, c.errf(tAt, fmt.Sprintf("metadata %q", key), "unknown value type %d", vt)
		}
		v, err := c.value(ValueType(vt), fmt.Sprintf("metadata %q", key), 0)
		if err != nil {
			return nil, err
		}
		f.kvIndex[key] = len(f.Metadata)
		f.Metadata = append(f.Metadata, KV{Key: key, Value: v})
		if key == "general.alignment" {
			a, ok := v.Uint()
			if !ok || a == 0 || a&(a-1) != 0 || a > maxAlignment {
				return nil, c.errf(at, "general.alignment", "%v is not a power of two up to %d", v, maxAlignment)
			}
			f.Alignment = a
		}
	}

	f.Tensors = make([]TensorInfo, 0, min(tensorCount, 4096))
	f.tensorIndex = make(map[string]int, min(tensorCount, 4096))
	for i := uint64(0); i < tensorCount; i++ {
		at := c.pos
		name, err := c.str(fmt.Sprintf("tensor %d name", i), maxNameLen)
		if err != nil {
			return nil, err
		}
		field := fmt.Sprintf("tensor %q", name)
		if _, dup := f.tensorIndex[name]; dup {
			return nil, c.errf(at, field, "duplicate tensor name")
		}
		ndAt := c.pos
		nd, err := c.u32(field + " dim count")
		if err != nil {
			return nil, err
		}
		if nd == 0 || nd > maxDims {
			return nil, c.errf(ndAt, field, "%d dims, want 1 to %d", nd, maxDims)
		}
		ti := TensorInfo{Name: name, Dims: make([]uint64, nd)}
		elems := uint64(1)
		for d := range ti.Dims {
			dAt := c.pos
			if ti.Dims[d], err = c.u64(field + " dim"); err != nil {
				return nil, err
			}
			if ti.Dims[d] == 0 {
				return nil, c.errf(dAt, field, "dim %d is zero", d)
			}
			hi, lo := bits.Mul64(elems, ti.Dims[d])
			if hi != 0 || lo > math.MaxInt64 {
				return nil, c.errf(dAt, field, "element count %v overflows int64", ti.Dims)
			}
			elems = lo
		}
		tyAt := c.pos
		ty, err := c.u32(field + " type")
		if err != nil {
			return nil, err
		}
		ti.Type = Type(ty)
		if !ti.Type.Valid() {
			return nil, c.errf(tyAt, field, "unknown tensor type %d", ty)
		}
		if bs := uint64(ti.Type.BlockSize()); ti.Dims[0]%bs != 0 {
			return nil, c.errf(ndAt, field, "row length %d is not a multiple of the %v block size %d", ti.Dims[0], ti.Type, bs)
		}
		if ti.Size, err = ti.Type.RowBytes(elems); err != nil || ti.Size > math.MaxInt64 {
			return nil, c.errf(ndAt, field, "byte size of %v %v overflows", ti.Dims, ti.Type)
		}
		offAt := c.pos
		if ti.Offset, err = c.u64(field + " offset"); err != nil {
			return nil, err
		}
		if ti.Offset%f.Alignment != 0 {
			return nil, c.errf(offAt, field, "data offset %d is not a multiple of the alignment %d", ti.Offset, f.Alignment)
		}
		if ti.Offset > math.MaxInt64-ti.Size {
			return nil, c.errf(offAt, field, "data offset %d + size %d overflows", ti.Offset, ti.Size)
		}
		f.tensorIndex[name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, ti)
	}

	// The data section starts at the next multiple of the alignment.
	end := uint64(c.pos)
	pad := (f.Alignment - end%f.Alignment) % f.Alignment
	f.DataOffset = int64(end + pad)
	if len(f.Tensors) == 0 {
		return f, nil // a metadata-only file may end right after its header
	}
	if f.DataOffset > size {
		return nil, c.errf(c.pos, "data section", "starts at %d, past the end of the %d-byte file (truncated)", f.DataOffset, size)
	}
	dataLen := uint64(size - f.DataOffset)

	// Tensor ranges must lie inside the data section and not overlap.
	order := make([]int, len(f.Tensors))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return f.Tensors[order[a]].Offset < f.Tensors[order[b]].Offset })
	var prevEnd uint64
	prev := ""
	for _, i := range order {
		t := &f.Tensors[i]
		if t.Offset+t.Size > dataLen {
			return nil, c.errf(f.DataOffset+int64(t.Offset), fmt.Sprintf("tensor %q", t.Name),
				"data [%d, %d) runs past the end of the data section (%d bytes; file truncated?)", t.Offset, t.Offset+t.Size, dataLen)
		}
		if t.Offset < prevEnd {
			return nil, c.errf(f.DataOffset+int64(t.Offset), fmt.Sprintf("tensor %q", t.Name),
				"data [%d, %d) overlaps tensor %q (ends at %d)", t.Offset, t.Offset+t.Size, prev, prevEnd)
		}
		prevEnd, prev = t.Offset+t.Size, t.Name
	}
	return f, nil
}
