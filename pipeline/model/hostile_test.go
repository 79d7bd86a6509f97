package model

import (
	"errors"
	"math"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/ggufedit"
	"github.com/forge-llm/forge/gguf/testmodels"
)

// hostileFile copies stories260K-F32 with e applied into a temporary file.
func hostileFile(t *testing.T, e ggufedit.Edit) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "hostile.gguf")
	if err := ggufedit.Copy(testmodels.Path(t, "stories260K-F32.gguf"), p, e); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestHostileHyperParameters is issue 17's item 2 and 6 at the config
// level: a NaN or negative epsilon, a zero or negative RoPE base, a block
// count of 2³² − 1 or 2⁴⁰, or one that disagrees with the tensors is an
// error naming the key at ConfigFromFile, before anything is sized by it.
// The whole open and check allocates little (the 2³² − 1 block count made
// `forge run` allocate 23 GB before this check existed).
func TestHostileHyperParameters(t *testing.T) {
	for _, c := range []struct {
		name string
		set  map[string]gguf.Value
		want string
	}{
		{"eps NaN", map[string]gguf.Value{"llama.attention.layer_norm_rms_epsilon": gguf.Float32(float32(math.NaN()))}, "llama.attention.layer_norm_rms_epsilon = NaN"},
		{"eps -1", map[string]gguf.Value{"llama.attention.layer_norm_rms_epsilon": gguf.Float32(-1)}, "llama.attention.layer_norm_rms_epsilon = -1"},
		{"eps Inf", map[string]gguf.Value{"llama.attention.layer_norm_rms_epsilon": gguf.Float32(float32(math.Inf(1)))}, "llama.attention.layer_norm_rms_epsilon = +Inf"},
		{"rope base 0", map[string]gguf.Value{"llama.rope.freq_base": gguf.Float32(0)}, "llama.rope.freq_base = 0"},
		{"rope base -1", map[string]gguf.Value{"llama.rope.freq_base": gguf.Float32(-1)}, "llama.rope.freq_base = -1"},
		{"rope base NaN", map[string]gguf.Value{"llama.rope.freq_base": gguf.Float32(float32(math.NaN()))}, "llama.rope.freq_base = NaN"},
		{"rope factor Inf", map[string]gguf.Value{"llama.rope.scaling.factor": gguf.Float32(float32(math.Inf(1)))}, "llama.rope.scaling.factor = +Inf"},
		{"blocks 2^32-1", map[string]gguf.Value{"llama.block_count": gguf.Uint32(0xFFFFFFFF)}, "llama.block_count"},
		{"blocks 2^40", map[string]gguf.Value{"llama.block_count": gguf.Uint64(1 << 40)}, "llama.block_count"},
		{"blocks 0", map[string]gguf.Value{"llama.block_count": gguf.Uint32(0)}, "llama.block_count = 0"},
		{"blocks 6 of 5", map[string]gguf.Value{"llama.block_count": gguf.Uint32(6)}, "llama.block_count = 6 but the file has tensors for 5 blocks"},
		{"blocks 4 of 5", map[string]gguf.Value{"llama.block_count": gguf.Uint32(4)}, `llama.block_count = 4 but the file has tensor "blk.4.`},
		{"heads 2^20", map[string]gguf.Value{"llama.attention.head_count": gguf.Uint32(1 << 20)}, "llama.attention.head_count = 1048576"},
		{"context 0", map[string]gguf.Value{"llama.context_length": gguf.Uint32(0)}, "llama.context_length = 0"},
		{"embedding 2^31", map[string]gguf.Value{"llama.embedding_length": gguf.Uint64(1 << 31)}, "llama.embedding_length"},
		{"vocab 2^30", map[string]gguf.Value{"llama.vocab_size": gguf.Uint32(1 << 30)}, "llama.vocab_size"},
		{"key length 2^30", map[string]gguf.Value{"llama.attention.key_length": gguf.Uint32(1 << 30)}, "llama.attention.key_length"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := hostileFile(t, ggufedit.Edit{Set: c.set})
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			f, err := gguf.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			_, err = ConfigFromFile(f)
			runtime.ReadMemStats(&after)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q spans several lines", err)
			}
			if got := after.TotalAlloc - before.TotalAlloc; got > 16<<20 {
				t.Errorf("open and check allocated %d bytes", got)
			}
		})
	}
}

// TestConfigErrorType: gguf's checks give a *gguf.ConfigError with the key.
func TestConfigErrorType(t *testing.T) {
	p := hostileFile(t, ggufedit.Edit{Set: map[string]gguf.Value{"llama.rope.freq_base": gguf.Float32(0)}})
	f, err := gguf.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, err = ConfigFromFile(f)
	var ce *gguf.ConfigError
	if !errors.As(err, &ce) || ce.Key != "llama.rope.freq_base" {
		t.Fatalf("error %v, want a *gguf.ConfigError for llama.rope.freq_base", err)
	}
}
