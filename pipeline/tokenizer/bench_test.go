package tokenizer

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
)

// benchText is ~1 MiB of llama.cpp's test strings (English, code-like
// punctuation, emoji, Cyrillic, CJK, Khmer, whitespace runs).
func benchText(b *testing.B) string {
	raw, err := os.ReadFile(testmodels.Path(b, "tokenizer/ggml-vocab-gpt-2.gguf.inp"))
	if err != nil {
		b.Fatal(err)
	}
	s := strings.ReplaceAll(string(raw), "\n__ggml_vocab_test__\n", "\n")
	return strings.Repeat(s, (1<<20)/len(s)+1)
}

// cpuTime is the CPU time this process has used. The benchmarks report it
// per operation as well ("cpu-ns/op") because the machine they run on is
// shared, and wall time then measures the neighbours too.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchEncode(b *testing.B, name, text string) {
	tok := load(b, name)
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	c0, n := cpuTime(), 0
	for b.Loop() {
		if _, err := tok.Encode(text, EncodeOptions{}); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.ReportMetric(float64(cpuTime()-c0)/float64(n), "cpu-ns/op")
}

func BenchmarkEncodeSPM(b *testing.B) {
	benchEncode(b, "tokenizer/ggml-vocab-llama-spm.gguf", benchText(b))
}

func BenchmarkEncodeBPE(b *testing.B) {
	benchEncode(b, "tokenizer/ggml-vocab-gpt-2.gguf", benchText(b))
}

// One word with no boundary, 8 KiB and 64 KiB: merging must not rescan
// the word, so 8× the bytes should take about 8× the time (n log n), not 64×.
func BenchmarkEncodeLongWord(b *testing.B) {
	for _, v := range []string{"gpt-2", "llama-spm"} {
		for _, kib := range []int{8, 64} {
			b.Run(fmt.Sprintf("%s/%dKiB", v, kib), func(b *testing.B) {
				benchEncode(b, "tokenizer/ggml-vocab-"+v+".gguf", strings.Repeat("abcdefgh", kib*128))
			})
		}
	}
}

func BenchmarkDecodeStreamBPE(b *testing.B) {
	tok := load(b, "tokenizer/ggml-vocab-gpt-2.gguf")
	text := benchText(b)
	ids, _ := tok.Encode(text, EncodeOptions{})
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	for b.Loop() {
		s := tok.NewStream()
		for _, id := range ids {
			s.Add(id)
		}
		s.Flush()
	}
}

// BenchmarkNew is the one-time cost of building the maps from metadata.
func BenchmarkNew(b *testing.B) {
	for _, name := range []string{"tokenizer/ggml-vocab-llama-spm.gguf", "tokenizer/ggml-vocab-gpt-2.gguf"} {
		f, err := gguf.Open(testmodels.Path(b, name))
		if err != nil {
			b.Fatal(err)
		}
		meta, err := f.Tokenizer()
		f.Close()
		if err != nil {
			b.Fatal(err)
		}
		b.Run(meta.Model, func(b *testing.B) {
			for b.Loop() {
				if _, err := New(meta); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
