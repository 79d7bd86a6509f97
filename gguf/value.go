package gguf

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"unsafe"
)

// ValueType is the type tag of a metadata value, as stored in the file.
type ValueType uint32

const (
	ValueUint8   ValueType = 0
	ValueInt8    ValueType = 1
	ValueUint16  ValueType = 2
	ValueInt16   ValueType = 3
	ValueUint32  ValueType = 4
	ValueInt32   ValueType = 5
	ValueFloat32 ValueType = 6
	ValueBool    ValueType = 7
	ValueString  ValueType = 8
	ValueArray   ValueType = 9
	ValueUint64  ValueType = 10
	ValueInt64   ValueType = 11
	ValueFloat64 ValueType = 12
)

var valueTypeNames = [...]string{"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array", "uint64", "int64", "float64"}

// Valid reports whether t is one of the 13 value types GGUF defines.
func (t ValueType) Valid() bool { return t <= ValueFloat64 }

func (t ValueType) String() string {
	if t.Valid() {
		return valueTypeNames[t]
	}
	return fmt.Sprintf("valuetype(%d)", uint32(t))
}

// fixedSize is the encoded size of a scalar of type t, or 0 for strings,
// arrays and unknown types (whose size depends on their content).
func (t ValueType) fixedSize() int {
	switch t {
	case ValueUint8, ValueInt8, ValueBool:
		return 1
	case ValueUint16, ValueInt16:
		return 2
	case ValueUint32, ValueInt32, ValueFloat32:
		return 4
	case ValueUint64, ValueInt64, ValueFloat64:
		return 8
	}
	return 0
}

func (t ValueType) isInt() bool {
	switch t {
	case ValueUint8, ValueInt8, ValueUint16, ValueInt16, ValueUint32, ValueInt32, ValueUint64, ValueInt64:
		return true
	}
	return false
}

func (t ValueType) isSigned() bool {
	return t == ValueInt8 || t == ValueInt16 || t == ValueInt32 || t == ValueInt64
}

// KV is one metadata entry.
type KV struct {
	Key   string
	Value Value
}

// Value is one metadata value. Scalars are held decoded; arrays are held as
// an *Array, which for values read from a file is only a reference to the
// bytes (so a 150k-entry token list costs nothing until it is asked for).
// The zero Value is invalid.
type Value struct {
	Type ValueType
	bits uint64 // integers (sign-extended for signed types), float bits, bool
	str  string
	arr  *Array
}

// Scalar constructors, used with Writer.AddKV and in tests.

func Uint8(v uint8) Value     { return Value{Type: ValueUint8, bits: uint64(v)} }
func Int8(v int8) Value       { return Value{Type: ValueInt8, bits: uint64(int64(v))} }
func Uint16(v uint16) Value   { return Value{Type: ValueUint16, bits: uint64(v)} }
func Int16(v int16) Value     { return Value{Type: ValueInt16, bits: uint64(int64(v))} }
func Uint32(v uint32) Value   { return Value{Type: ValueUint32, bits: uint64(v)} }
func Int32(v int32) Value     { return Value{Type: ValueInt32, bits: uint64(int64(v))} }
func Uint64(v uint64) Value   { return Value{Type: ValueUint64, bits: v} }
func Int64(v int64) Value     { return Value{Type: ValueInt64, bits: uint64(v)} }
func Float32(v float32) Value { return Value{Type: ValueFloat32, bits: uint64(math.Float32bits(v))} }
func Float64(v float64) Value { return Value{Type: ValueFloat64, bits: math.Float64bits(v)} }
func Str(v string) Value      { return Value{Type: ValueString, str: v} }
func Bool(v bool) Value {
	var b uint64
	if v {
		b = 1
	}
	return Value{Type: ValueBool, bits: b}
}

// ArrayOf makes an array value from a Go slice: []uint8, []int8, []uint16,
// []int16, []uint32, []int32, []uint64, []int64, []float32, []float64,
// []bool, []string, or []Value for arrays of arrays (each element must then
// be an array value). It panics on any other type: a programming error.
func ArrayOf(items any) Value {
	var elem ValueType
	var n int
	switch s := items.(type) {
	case []uint8:
		elem, n = ValueUint8, len(s)
	case []int8:
		elem, n = ValueInt8, len(s)
	case []uint16:
		elem, n = ValueUint16, len(s)
	case []int16:
		elem, n = ValueInt16, len(s)
	case []uint32:
		elem, n = ValueUint32, len(s)
	case []int32:
		elem, n = ValueInt32, len(s)
	case []uint64:
		elem, n = ValueUint64, len(s)
	case []int64:
		elem, n = ValueInt64, len(s)
	case []float32:
		elem, n = ValueFloat32, len(s)
	case []float64:
		elem, n = ValueFloat64, len(s)
	case []bool:
		elem, n = ValueBool, len(s)
	case []string:
		elem, n = ValueString, len(s)
	case []Value:
		elem, n = ValueArray, len(s)
		for i, v := range s {
			if v.Type != ValueArray {
				panic(fmt.Sprintf("gguf: ArrayOf: element %d is %v, want array", i, v.Type))
			}
		}
	default:
		panic(fmt.Sprintf("gguf: ArrayOf: unsupported element type %T", items))
	}
	return Value{Type: ValueArray, arr: &Array{Elem: elem, Len: uint64(n), items: items}}
}

// Uint returns an integer value as uint64; ok is false for non-integers and
// for negative values.
func (v Value) Uint() (uint64, bool) {
	if !v.Type.isInt() || (v.Type.isSigned() && int64(v.bits) < 0) {
		return 0, false
	}
	return v.bits, true
}

// Int returns an integer value as int64; ok is false for non-integers and
// for unsigned values above MaxInt64.
func (v Value) Int() (int64, bool) {
	if !v.Type.isInt() || (!v.Type.isSigned() && v.bits > math.MaxInt64) {
		return 0, false
	}
	return int64(v.bits), true
}

// Float returns a float32 or float64 value as float64.
func (v Value) Float() (float64, bool) {
	switch v.Type {
	case ValueFloat32:
		return float64(math.Float32frombits(uint32(v.bits))), true
	case ValueFloat64:
		return math.Float64frombits(v.bits), true
	}
	return 0, false
}

// Bool returns a bool value.
func (v Value) Bool() (bool, bool) { return v.bits != 0, v.Type == ValueBool }

// Text returns a string value (String is the printable form of any value).
func (v Value) Text() (string, bool) { return v.str, v.Type == ValueString }

// Array returns an array value.
func (v Value) Array() (*Array, bool) { return v.arr, v.Type == ValueArray && v.arr != nil }

// String formats the value for people: strings quoted, arrays abbreviated
// to their first few elements.
func (v Value) String() string { return v.Format(8) }

// Format is String with at most maxItems array elements shown.
func (v Value) Format(maxItems int) string {
	switch {
	case v.Type == ValueString:
		s := v.str
		if len(s) > 200 {
			s = s[:200] + "…"
		}
		return fmt.Sprintf("%q", s)
	case v.Type == ValueBool:
		return fmt.Sprint(v.bits != 0)
	case v.Type == ValueFloat32:
		// Shortest form that reads back as the same float32: 1e-05, not
		// 9.999999747378752e-06.
		return strconv.FormatFloat(float64(math.Float32frombits(uint32(v.bits))), 'g', -1, 32)
	case v.Type == ValueFloat64:
		return strconv.FormatFloat(math.Float64frombits(v.bits), 'g', -1, 64)
	case v.Type.isSigned():
		return fmt.Sprint(int64(v.bits))
	case v.Type.isInt():
		return fmt.Sprint(v.bits)
	case v.Type == ValueArray && v.arr != nil:
		return v.arr.format(maxItems)
	}
	return "<invalid>"
}

// Array is an array value. Arrays read from a file refer to their bytes in
// the file and are decoded on request, so opening a file never decodes a
// token list; arrays built with ArrayOf hold a Go slice.
type Array struct {
	Elem ValueType // element type
	Len  uint64    // element count

	// In a file: the element bytes are [off, off+size) of src.
	src  io.ReaderAt
	off  int64
	size int64

	items any // built in memory by ArrayOf
}

// encodedSize is the encoded size of the elements (not counting the type
// and count that precede them in the file).
func (a *Array) encodedSize() (int64, error) {
	if a.src != nil {
		return a.size, nil
	}
	raw, err := a.encode()
	return int64(len(raw)), err
}

// raw returns the little-endian element bytes exactly as stored.
func (a *Array) raw() ([]byte, error) {
	if a.src == nil {
		return a.encode()
	}
	buf := make([]byte, a.size)
	// io.ReaderAt may report EOF with a full read at the end of the input.
	if k, err := a.src.ReadAt(buf, a.off); k < len(buf) {
		return nil, fmt.Errorf("gguf: reading %d-byte array at offset %d: %w", a.size, a.off, err)
	}
	return buf, nil
}

// encode serialises an in-memory array.
func (a *Array) encode() ([]byte, error) {
	var out []byte
	le := binary.LittleEndian
	switch s := a.items.(type) {
	case []uint8:
		out = append(out, s...)
	case []int8:
		for _, x := range s {
			out = append(out, byte(x))
		}
	case []bool:
		for _, x := range s {
			b := byte(0)
			if x {
				b = 1
			}
			out = append(out, b)
		}
	case []uint16:
		for _, x := range s {
			out = le.AppendUint16(out, x)
		}
	case []int16:
		for _, x := range s {
			out = le.AppendUint16(out, uint16(x))
		}
	case []uint32:
		for _, x := range s {
			out = le.AppendUint32(out, x)
		}
	case []int32:
		for _, x := range s {
			out = le.AppendUint32(out, uint32(x))
		}
	case []float32:
		for _, x := range s {
			out = le.AppendUint32(out, math.Float32bits(x))
		}
	case []uint64:
		for _, x := range s {
			out = le.AppendUint64(out, x)
		}
	case []int64:
		for _, x := range s {
			out = le.AppendUint64(out, uint64(x))
		}
	case []float64:
		for _, x := range s {
			out = le.AppendUint64(out, math.Float64bits(x))
		}
	case []string:
		for _, x := range s {
			out = le.AppendUint64(out, uint64(len(x)))
			out = append(out, x...)
		}
	case []Value:
		for _, x := range s {
			inner, err := x.arr.raw()
			if err != nil {
				return nil, err
			}
			out = le.AppendUint32(out, uint32(x.arr.Elem))
			out = le.AppendUint64(out, x.arr.Len)
			out = append(out, inner...)
		}
	default:
		return nil, fmt.Errorf("gguf: array holds no data")
	}
	return out, nil
}

// Strings decodes an array of strings. The strings share one buffer read
// from the file, so a 150k-token vocabulary costs one read and one slice.
func (a *Array) Strings() ([]string, error) {
	if a.Elem != ValueString {
		return nil, fmt.Errorf("gguf: array of %v, not string", a.Elem)
	}
	if s, ok := a.items.([]string); ok {
		return s, nil
	}
	buf, err := a.raw()
	if err != nil {
		return nil, err
	}
	out := make([]string, a.Len)
	p := 0
	for i := range out {
		if len(buf)-p < 8 {
			return nil, fmt.Errorf("gguf: string array at offset %d: element %d truncated", a.off, i)
		}
		n := binary.LittleEndian.Uint64(buf[p:])
		p += 8
		if n > uint64(len(buf)-p) {
			return nil, fmt.Errorf("gguf: string array at offset %d: element %d length %d overruns the array", a.off, i, n)
		}
		if n > 0 {
			// buf is never written again, so the strings may alias it.
			out[i] = unsafe.String(&buf[p], int(n))
		}
		p += int(n)
	}
	return out, nil
}

// Float32s decodes an array of float32.
func (a *Array) Float32s() ([]float32, error) {
	if a.Elem != ValueFloat32 {
		return nil, fmt.Errorf("gguf: array of %v, not float32", a.Elem)
	}
	if s, ok := a.items.([]float32); ok {
		return s, nil
	}
	buf, err := a.raw()
	if err != nil {
		return nil, err
	}
	out := make([]float32, a.Len)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
	}
	return out, nil
}

// Int32s decodes an array of int32 (or of any integer type whose values
// all fit in an int32, since writers disagree on the token_type width).
func (a *Array) Int32s() ([]int32, error) {
	if !a.Elem.isInt() {
		return nil, fmt.Errorf("gguf: array of %v, not int32", a.Elem)
	}
	if s, ok := a.items.([]int32); ok {
		return s, nil
	}
	if a.Elem == ValueInt32 && a.src != nil {
		buf, err := a.raw()
		if err != nil {
			return nil, err
		}
		out := make([]int32, a.Len)
		for i := range out {
			out[i] = int32(binary.LittleEndian.Uint32(buf[4*i:]))
		}
		return out, nil
	}
	vals, err := a.Values()
	if err != nil {
		return nil, err
	}
	out := make([]int32, len(vals))
	for i, v := range vals {
		x, ok := v.Int()
		if !ok || x < math.MinInt32 || x > math.MaxInt32 {
			return nil, fmt.Errorf("gguf: array element %d (%v) does not fit in int32", i, v)
		}
		out[i] = int32(x)
	}
	return out, nil
}

// Values decodes every element. Elements that are arrays stay lazy.
func (a *Array) Values() ([]Value, error) {
	if a.items != nil && a.src == nil {
		return a.memValues(), nil
	}
	buf, err := a.raw()
	if err != nil {
		return nil, err
	}
	out := make([]Value, 0, min(a.Len, 1<<16))
	p := 0
	for i := uint64(0); i < a.Len; i++ {
		v, n, err := decodeValue(buf[p:], a.Elem, a.src, a.off+int64(p), 0)
		if err != nil {
			return nil, fmt.Errorf("gguf: array at offset %d element %d: %w", a.off, i, err)
		}
		out = append(out, v)
		p += n
	}
	return out, nil
}

func (a *Array) memValues() []Value {
	var out []Value
	switch s := a.items.(type) {
	case []uint8:
		for _, x := range s {
			out = append(out, Uint8(x))
		}
	case []int8:
		for _, x := range s {
			out = append(out, Int8(x))
		}
	case []uint16:
		for _, x := range s {
			out = append(out, Uint16(x))
		}
	case []int16:
		for _, x := range s {
			out = append(out, Int16(x))
		}
	case []uint32:
		for _, x := range s {
			out = append(out, Uint32(x))
		}
	case []int32:
		for _, x := range s {
			out = append(out, Int32(x))
		}
	case []uint64:
		for _, x := range s {
			out = append(out, Uint64(x))
		}
	case []int64:
		for _, x := range s {
			out = append(out, Int64(x))
		}
	case []float32:
		for _, x := range s {
			out = append(out, Float32(x))
		}
	case []float64:
		for _, x := range s {
			out = append(out, Float64(x))
		}
	case []bool:
		for _, x := range s {
			out = append(out, Bool(x))
		}
	case []string:
		for _, x := range s {
			out = append(out, Str(x))
		}
	case []Value:
		out = append(out, s...)
	}
	return out
}

// decodeValue decodes one value of type t from the front of buf (which was
// read from src at offset off) and returns it with its encoded size. The
// buffer is already known to hold the whole value, but lengths are checked
// again so a file changed since Open cannot cause an out-of-range slice.
func decodeValue(buf []byte, t ValueType, src io.ReaderAt, off int64, depth int) (Value, int, error) {
	le := binary.LittleEndian
	if n := t.fixedSize(); n > 0 {
		if len(buf) < n {
			return Value{}, 0, fmt.Errorf("%v truncated", t)
		}
		v := Value{Type: t}
		switch n {
		case 1:
			v.bits = uint64(buf[0])
			if t == ValueInt8 {
				v.bits = uint64(int64(int8(buf[0])))
			}
		case 2:
			v.bits = uint64(le.Uint16(buf))
			if t == ValueInt16 {
				v.bits = uint64(int64(int16(le.Uint16(buf))))
			}
		case 4:
			v.bits = uint64(le.Uint32(buf))
			if t == ValueInt32 {
				v.bits = uint64(int64(int32(le.Uint32(buf))))
			}
		case 8:
			v.bits = le.Uint64(buf)
		}
		return v, n, nil
	}
	switch t {
	case ValueString:
		if len(buf) < 8 {
			return Value{}, 0, fmt.Errorf("string length truncated")
		}
		n := le.Uint64(buf)
		if n > uint64(len(buf)-8) {
			return Value{}, 0, fmt.Errorf("string length %d overruns", n)
		}
		return Str(string(buf[8 : 8+n])), 8 + int(n), nil
	case ValueArray:
		if len(buf) < 12 {
			return Value{}, 0, fmt.Errorf("array header truncated")
		}
		elem, count := ValueType(le.Uint32(buf)), le.Uint64(buf[4:])
		size, err := scanArray(buf[12:], elem, count, depth+1)
		if err != nil {
			return Value{}, 0, err
		}
		return Value{Type: ValueArray, arr: &Array{Elem: elem, Len: count, src: src, off: off + 12, size: int64(size)}}, 12 + size, nil
	}
	return Value{}, 0, fmt.Errorf("unknown value type %d", uint32(t))
}

// scanArray returns the encoded size of count elements of type elem at the
// front of buf, checking that they fit.
func scanArray(buf []byte, elem ValueType, count uint64, depth int) (int, error) {
	if depth > maxArrayDepth {
		return 0, fmt.Errorf("arrays nested deeper than %d", maxArrayDepth)
	}
	if n := elem.fixedSize(); n > 0 {
		if count > uint64(len(buf)/n) {
			return 0, fmt.Errorf("array of %d %v overruns", count, elem)
		}
		return int(count) * n, nil
	}
	p := 0
	for i := uint64(0); i < count; i++ {
		n, err := measureElem(buf[p:], elem, depth)
		if err != nil {
			return 0, err
		}
		p += n
	}
	return p, nil
}

// measureElem returns the encoded size of the string or array element at
// the front of buf.
func measureElem(buf []byte, t ValueType, depth int) (int, error) {
	le := binary.LittleEndian
	switch t {
	case ValueString:
		if len(buf) < 8 {
			return 0, fmt.Errorf("string length truncated")
		}
		n := le.Uint64(buf)
		if n > uint64(len(buf)-8) {
			return 0, fmt.Errorf("string length %d overruns", n)
		}
		return 8 + int(n), nil
	case ValueArray:
		if len(buf) < 12 {
			return 0, fmt.Errorf("array header truncated")
		}
		n, err := scanArray(buf[12:], ValueType(le.Uint32(buf)), le.Uint64(buf[4:]), depth+1)
		return 12 + n, err
	}
	return 0, fmt.Errorf("unknown value type %d", uint32(t))
}

func (a *Array) format(maxItems int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[%v×%d]", a.Elem, a.Len)
	if a.Len == 0 {
		return b.String()
	}
	if a.Elem == ValueArray && a.src != nil && a.size > 1<<20 {
		return b.String() // do not read megabytes to print a few nested elements
	}
	vals, err := a.Head(maxItems)
	if err != nil {
		return b.String() + " <" + err.Error() + ">"
	}
	b.WriteString(" [")
	for i, v := range vals {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(v.Format(maxItems))
	}
	if a.Len > uint64(len(vals)) {
		fmt.Fprintf(&b, ", … %d more", a.Len-uint64(len(vals)))
	}
	b.WriteString("]")
	return b.String()
}

// Head decodes at most n leading elements, reading only as much of the file
// as they need (a bounded prefix for strings).
func (a *Array) Head(n int) ([]Value, error) {
	if a.src == nil {
		vals := a.memValues()
		return vals[:min(len(vals), n)], nil
	}
	want := a.size
	if fs := a.Elem.fixedSize(); fs > 0 {
		want = int64(min(a.Len, uint64(n))) * int64(fs)
	} else {
		want = min(want, 64<<10)
	}
	buf := make([]byte, want)
	if k, err := a.src.ReadAt(buf, a.off); k < len(buf) {
		return nil, fmt.Errorf("gguf: reading array at offset %d: %w", a.off, err)
	}
	var out []Value
	p := 0
	for i := uint64(0); i < a.Len && len(out) < n; i++ {
		v, k, err := decodeValue(buf[p:], a.Elem, a.src, a.off+int64(p), 0)
		if err != nil {
			break // the prefix ended inside an element: show what we have
		}
		out = append(out, v)
		p += k
	}
	return out, nil
}
