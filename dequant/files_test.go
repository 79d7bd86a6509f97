package dequant

import (
	"bytes"
	"fmt"
	"math"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
)

// maxRelRMS is the largest relative RMS error ‖y-x‖/‖x‖ accepted per type
// when a quantized tensor from the bundled files is compared with its F32
// original: the worst tensor measured (the test logs it) plus 20%. A wrong
// nibble order, scale packing or sign pushes the error of any of them far
// above its bound (to ~1 or more).
var maxRelRMS = map[gguf.Type]float64{
	gguf.TypeF16:    0.00025,
	gguf.TypeBF16:   0.0024,
	gguf.TypeQ8_0:   0.0075,
	gguf.TypeQ6_K:   0.021,
	gguf.TypeQ5_0:   0.060,
	gguf.TypeQ5_1:   0.050,
	gguf.TypeQ5_K:   0.043,
	gguf.TypeQ4_0:   0.115,
	gguf.TypeQ4_1:   0.105,
	gguf.TypeQ4_K:   0.086,
	gguf.TypeIQ4_NL: 0.100,
	gguf.TypeIQ4_XS: 0.092,
	gguf.TypeQ3_K:   0.18,
	gguf.TypeQ2_K:   0.36,
}

// relRMS returns ‖y-x‖/‖x‖, accumulated in float64.
func relRMS(y, x []float32) float64 {
	var num, den float64
	for i := range x {
		d := float64(y[i]) - float64(x[i])
		num += d * d
		den += float64(x[i]) * float64(x[i])
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}

// openF32 loads every tensor of an F32 original as float32.
func openF32(t *testing.T, name string) map[string][]float32 {
	t.Helper()
	f, err := gguf.Open(testmodels.Path(t, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]float32{}
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		if ti.Type != gguf.TypeF32 {
			t.Fatalf("%s: tensor %q is %s, want F32", name, ti.Name, ti.Type)
		}
		data, err := f.TensorData(ti)
		if err != nil {
			t.Fatal(err)
		}
		v := make([]float32, ti.Elements())
		if err := ToFloat32(ti.Type, data, v); err != nil {
			t.Fatal(err)
		}
		out[ti.Name] = v
	}
	return out
}

// typeStats accumulates the error of every tensor of one type.
type typeStats struct {
	tensors, exact int
	num, den       float64
	worst          float64
	worstName      string
}

// TestBundledFiles dequantizes every tensor of every quantized bundled file
// (stories260K-* and synth-kq-*), compares it with the F32 original, and —
// for the types Quantize implements — checks that quantizing the original
// reproduces the file's bytes exactly, which pins both directions to
// llama-quantize's reference code.
func TestBundledFiles(t *testing.T) {
	stats := map[gguf.Type]*typeStats{}
	requant := map[string][]byte{} // "type/tensor" → Quantize of the original; files share many
	for _, family := range []string{"stories260K", "synth-kq"} {
		orig := openF32(t, family+"-F32.gguf")
		for _, path := range testmodels.Glob(t, family+"-*.gguf") {
			base := filepath.Base(path)
			if strings.HasSuffix(base, "-F32.gguf") || strings.Contains(base, "ggml-org") {
				continue
			}
			t.Run(base, func(t *testing.T) {
				checkFile(t, path, orig, stats, requant)
			})
		}
	}
	var types []gguf.Type
	for typ := range stats {
		types = append(types, typ)
	}
	sort.Slice(types, func(i, j int) bool { return types[i] < types[j] })
	for _, typ := range types {
		s := stats[typ]
		t.Logf("%-7s %3d tensors  rel RMS %.5f (worst %.5f %s)  requantized byte-exact: %s",
			typ, s.tensors, math.Sqrt(s.num/s.den), s.worst, s.worstName, exactNote(typ, s))
	}
}

func exactNote(typ gguf.Type, s *typeStats) string {
	if encoderFor(typ) == nil {
		return "n/a (no quantizer)"
	}
	return fmt.Sprintf("%d/%d", s.exact, s.tensors)
}

func checkFile(t *testing.T, path string, orig map[string][]float32, stats map[gguf.Type]*typeStats, requant map[string][]byte) {
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		want, ok := orig[ti.Name]
		if !ok {
			t.Fatalf("tensor %q has no F32 original", ti.Name)
		}
		if ti.Type == gguf.TypeF32 {
			continue
		}
		data, err := f.TensorData(ti)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]float32, ti.Elements())
		if err := ToFloat32(ti.Type, data, got); err != nil {
			t.Fatalf("tensor %q: %v", ti.Name, err)
		}
		e := relRMS(got, want)
		bound, ok := maxRelRMS[ti.Type]
		if !ok {
			t.Fatalf("tensor %q: no error bound for type %s", ti.Name, ti.Type)
		}
		if e > bound {
			t.Errorf("tensor %q (%s): relative RMS error %.5f > %.5f", ti.Name, ti.Type, e, bound)
		}
		s := stats[ti.Type]
		if s == nil {
			s = &typeStats{}
			stats[ti.Type] = s
		}
		s.tensors++
		for k := range want {
			d := float64(got[k]) - float64(want[k])
			s.num += d * d
			s.den += float64(want[k]) * float64(want[k])
		}
		if e > s.worst {
			s.worst, s.worstName = e, filepath.Base(path)+":"+ti.Name
		}
		if encoderFor(ti.Type) != nil {
			key := ti.Type.String() + "/" + ti.Name
			q, ok := requant[key]
			if !ok {
				q = make([]byte, len(data))
				if err := Quantize(ti.Type, want, q); err != nil {
					t.Fatal(err)
				}
				requant[key] = q
			}
			if bytes.Equal(q, data) {
				s.exact++
			} else {
				bs := ti.Type.BlockBytes()
				for k := range q {
					if q[k] != data[k] {
						t.Errorf("tensor %q (%s): Quantize differs from the file at byte %d (block %d, byte %d of it): %#x vs %#x",
							ti.Name, ti.Type, k, k/bs, k%bs, q[k], data[k])
						break
					}
				}
			}
		}
	}
}
