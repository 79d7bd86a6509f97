package actors

import (
	"fmt"
	"unsafe"

	"github.com/forge-llm/forge/dequant"
	"github.com/forge-llm/forge/gguf"
)

// Converter decides what the backend consumes for each tensor and turns
// file blocks into it. It is the dequantizer pool's job description.
type Converter interface {
	// Target is the type the backend will hold t in (t.Type for a
	// pass-through).
	Target(t *gguf.TensorInfo) (gguf.Type, error)
	// Convert turns whole rows of type from (src) into type to (dst).
	Convert(from, to gguf.Type, src, dst []byte) error
}

// Conversion is the host-side Converter: blocks the backend reads pass
// through untouched; everything else, or everything with AllF32, is
// dequantized to F32.
type Conversion struct {
	// Reads reports the types the backend's kernels consume as they are;
	// nil means every type (the CPU backend reads every block format).
	Reads func(gguf.Type) bool
	// AllF32 dequantizes every tensor to F32 (the host-f32 strategy).
	AllF32 bool
}

// Target implements Converter.
func (c Conversion) Target(t *gguf.TensorInfo) (gguf.Type, error) {
	if !c.AllF32 && (c.Reads == nil || c.Reads(t.Type)) {
		return t.Type, nil
	}
	if t.Type != gguf.TypeF32 && !dequant.Supported(t.Type) {
		return 0, fmt.Errorf("type %s can not be converted to F32", t.Type)
	}
	return gguf.TypeF32, nil
}

// Convert implements Converter.
func (c Conversion) Convert(from, to gguf.Type, src, dst []byte) error {
	if to != gguf.TypeF32 {
		return fmt.Errorf("converting %s to %s is not supported", from, to)
	}
	if from == gguf.TypeF32 {
		if len(dst) != len(src) {
			return fmt.Errorf("converting F32: %d bytes into %d", len(src), len(dst))
		}
		copy(dst, src)
		return nil
	}
	if len(dst)%4 != 0 || uintptr(unsafe.Pointer(unsafe.SliceData(dst)))%4 != 0 {
		return fmt.Errorf("converting %s: destination not float32-aligned", from)
	}
	out := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(dst))), len(dst)/4)
	return dequant.ToFloat32(from, src, out)
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
