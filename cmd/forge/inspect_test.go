package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
)

func runInspect(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	err := newApp(&out, &errb).Run(append([]string{"forge", "inspect"}, args...))
	return out.String(), err
}

func inspectJSON(t *testing.T, path string) inspectReport {
	t.Helper()
	out, err := runInspect(t, path, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var r inspectReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return r
}

// Per-type totals worked out by hand from the shapes and the type table in
// gguf/testdata/README.md (stories260K: embedding 64, ff 172, KV dim 32,
// vocab 512, 5 layers; synth-kq: embedding 256, ff 512, KV dim 128, 1 layer).
var wantTypes = map[string]map[string][2]uint64{ // file → type → {tensors, bytes}
	"stories260K-F32.gguf": {"F32": {48, 1171200}},
	"stories260K-Q4_0.gguf": {
		"Q4_0": {31, 204288 / 32 * 18}, // token_embd + 5 × (q, k, v, o, gate, up)
		"F16":  {5, 5 * 172 * 64 * 2},  // ffn_down
		"Q8_0": {1, 64 * 512 / 32 * 34},
		"F32":  {11, 11 * 64 * 4}, // 5 × 2 norms + output_norm
	},
	"synth-kq-Q4_K_M.gguf": {
		"Q4_K": {6, (131072 + 65536 + 32768 + 65536 + 131072 + 131072) / 256 * 144},
		"Q6_K": {3, (32768 + 131072 + 131072) / 256 * 210}, // attn_v, ffn_down, output
		"F32":  {3, 3 * 256 * 4},
	},
}

// inspect on every bundled file: the right tensor count, per-type totals
// that match the tensors, and header + tensors + padding = file size.
func TestInspectBundled(t *testing.T) {
	paths := append(testmodels.Glob(t, "*.gguf"), testmodels.Glob(t, "tokenizer/*.gguf")...)
	for _, path := range paths {
		name := filepath.Base(path)
		t.Run(name, func(t *testing.T) {
			r := inspectJSON(t, path)
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			wantCount := 0
			switch {
			case strings.HasPrefix(name, "stories260K"):
				wantCount = 48
			case strings.HasPrefix(name, "synth-kq"):
				wantCount = 12
			}
			if r.TensorCount != wantCount || len(r.Tensors) != wantCount {
				t.Errorf("%d tensors (%d listed), want %d", r.TensorCount, len(r.Tensors), wantCount)
			}
			if r.FileBytes != st.Size() || r.HeaderBytes+int64(r.TensorBytes)+r.PaddingBytes != st.Size() || r.PaddingBytes < 0 {
				t.Errorf("header %d + tensors %d + padding %d != file %d", r.HeaderBytes, r.TensorBytes, r.PaddingBytes, st.Size())
			}
			// Padding is at most one alignment gap per tensor.
			if r.PaddingBytes >= int64(r.TensorCount+1)*int64(r.Alignment) {
				t.Errorf("padding %d too large for %d tensors", r.PaddingBytes, r.TensorCount)
			}
			var sumBytes, sumElems uint64
			count := 0
			for _, tt := range r.Types {
				sumBytes += tt.Bytes
				sumElems += tt.Elements
				count += tt.Tensors
				typ, ok := gguf.TypeByName(tt.Type)
				if !ok {
					t.Fatalf("unknown type %q", tt.Type)
				}
				if b, _ := typ.RowBytes(tt.Elements); b != tt.Bytes {
					t.Errorf("%s: %d elements take %d bytes, listed %d", tt.Type, tt.Elements, b, tt.Bytes)
				}
			}
			if sumBytes != r.TensorBytes || sumElems != r.Params || count != r.TensorCount {
				t.Errorf("type totals %d bytes %d elements %d tensors; overall %d %d %d", sumBytes, sumElems, count, r.TensorBytes, r.Params, r.TensorCount)
			}
			if want, ok := wantTypes[name]; ok {
				if len(r.Types) != len(want) {
					t.Errorf("types %+v, want %v", r.Types, want)
				}
				for _, tt := range r.Types {
					if w := want[tt.Type]; w[0] != uint64(tt.Tensors) || w[1] != tt.Bytes {
						t.Errorf("%s: %d tensors %d bytes, want %d %d", tt.Type, tt.Tensors, tt.Bytes, w[0], w[1])
					}
				}
			}
			if wantCount > 0 && (r.Arch != "llama" || r.Vocab != 512 || r.ConfigError != "") {
				t.Errorf("arch %q vocab %d config error %q", r.Arch, r.Vocab, r.ConfigError)
			}
		})
	}
}

func TestInspectText(t *testing.T) {
	out, err := runInspect(t, testmodels.Path(t, "stories260K-Q4_0.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"size          277,024 bytes (271 KiB) = header 14,240 + tensors 262,624 + padding 160",
		"parameters    292,800 (293K)", "layers        5", "context       128", "heads         8 (4 KV)",
		"vocabulary    512 (llama tokenizer)", "tensors       48",
		"Q4_0       31   204,288  114,912  43.8%",
		`[string×512] ["<unk>", "<s>", "</s>", "<0x00>", "<0x01>", "<0x02>", "<0x03>", "<0x04>", … 504 more]`,
		"llama.attention.layer_norm_rms_epsilon  float32    1e-05",
		"blk.0.ffn_down.weight     F16   [172 64]  60672   22,016",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q\n%s", want, out)
		}
	}
	// A file without tensors (a tokenizer vocabulary) prints its config error
	// rather than failing.
	if out, err := runInspect(t, testmodels.Path(t, "tokenizer/ggml-vocab-gpt-2.gguf")); err != nil || !strings.Contains(out, "vocabulary    50257 (gpt2 tokenizer)") {
		t.Errorf("vocab file: %v\n%s", err, out)
	}
}

func floats(t *testing.T, b []byte) []float32 {
	t.Helper()
	if len(b)%4 != 0 {
		t.Fatalf("%d bytes is not whole float32s", len(b))
	}
	f := make([]float32, len(b)/4)
	for i := range f {
		f[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return f
}

// --dump of an F32 tensor gives its bytes unchanged; of quantized tensors
// (Q8_0, Q4_0, F16), values close to the F32 original: the quantized files
// were made from the F32 one.
func TestInspectDump(t *testing.T) {
	ref := testmodels.Path(t, "stories260K-F32.gguf")
	f, err := gguf.Open(ref)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	raw := func(name string) []float32 {
		ti, _ := f.Tensor(name)
		v, err := f.TensorData(ti)
		if err != nil {
			t.Fatal(err)
		}
		return floats(t, v)
	}
	out, err := runInspect(t, ref, "--dump", "token_embd.weight")
	if err != nil {
		t.Fatal(err)
	}
	ti, _ := f.Tensor("token_embd.weight")
	if v, _ := f.TensorData(ti); !bytes.Equal([]byte(out), v) {
		t.Error("F32 dump differs from the tensor bytes")
	}
	for _, c := range []struct {
		file, tensor string
		tol          float64 // relative L2 error
	}{
		{"stories260K-Q4_0.gguf", "output.weight", 0.01},          // Q8_0
		{"stories260K-Q4_0.gguf", "blk.1.attn_q.weight", 0.15},    // Q4_0
		{"stories260K-Q8_0.gguf", "blk.2.ffn_down.weight", 0.001}, // F16
		{"stories260K-BF16.gguf", "blk.3.ffn_gate.weight", 0.01},  // BF16
		{"stories260K-IQ4_NL.gguf", "blk.0.ffn_up.weight", 0.15},  // IQ4_NL
		{"stories260K-F32.gguf", "blk.4.ffn_norm.weight", 0},      // F32
	} {
		out, err := runInspect(t, testmodels.Path(t, c.file), "--dump="+c.tensor)
		if err != nil {
			t.Fatalf("%s %s: %v", c.file, c.tensor, err)
		}
		got, want := floats(t, []byte(out)), raw(c.tensor)
		if len(got) != len(want) {
			t.Fatalf("%s %s: %d values, want %d", c.file, c.tensor, len(got), len(want))
		}
		var num, den float64
		for i := range got {
			d := float64(got[i]) - float64(want[i])
			num += d * d
			den += float64(want[i]) * float64(want[i])
		}
		if rel := math.Sqrt(num / den); rel > c.tol || (c.tol == 0 && num != 0) {
			t.Errorf("%s %s: relative error %.4g, want ≤ %g", c.file, c.tensor, rel, c.tol)
		}
	}
	if _, err := runInspect(t, ref, "--dump", "no.such.tensor"); err == nil || !strings.Contains(err.Error(), `no tensor "no.such.tensor"`) {
		t.Errorf("missing tensor: %v", err)
	}
}

// Flags work before FILE (parsed by urfave/cli) as well as after it.
func TestInspectFlagPositions(t *testing.T) {
	path := testmodels.Path(t, "stories260K-Q4_0.gguf")
	a, err1 := runInspect(t, "--json", path)
	b, err2 := runInspect(t, path, "-json")
	if err1 != nil || err2 != nil || a != b || !strings.HasPrefix(a, "{") {
		t.Errorf("--json before/after FILE: %v %v, outputs equal %v", err1, err2, a == b)
	}
	c, err1 := runInspect(t, "--dump", "output_norm.weight", path)
	d, err2 := runInspect(t, path, "--dump", "output_norm.weight")
	if err1 != nil || err2 != nil || c != d || len(c) != 64*4 {
		t.Errorf("--dump before/after FILE: %v %v, %d and %d bytes", err1, err2, len(c), len(d))
	}
	if _, err := runInspect(t, path, "--frobnicate"); err == nil || !strings.Contains(err.Error(), "unknown flag --frobnicate") {
		t.Errorf("unknown flag: %v", err)
	}
}

func TestInspectErrors(t *testing.T) {
	if _, err := runInspect(t); err == nil || !strings.Contains(err.Error(), "FILE missing") {
		t.Errorf("no file: %v", err)
	}
	if _, err := runInspect(t, "a.gguf", "b.gguf"); err == nil || !strings.Contains(err.Error(), "one FILE expected") {
		t.Errorf("two files: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "bad.gguf")
	os.WriteFile(bad, []byte("GGUF\x01\x00\x00\x00"), 0o600)
	if _, err := runInspect(t, bad); err == nil || !strings.Contains(err.Error(), "version 1 is not supported") {
		t.Errorf("v1 file: %v", err)
	}
}
