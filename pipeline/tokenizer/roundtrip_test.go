package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

var roundTripAtoms = []string{
	"a", "Z", "the", " ", "  ", "\n", "\t", "\r\n", "é", "ß", "ж", "中", "日本", "가", "😀", "🦙",
	"0", "42", "12345", "!", "...", "'s", "'LL", "$", "<", ">", "\u00a0", "\u3000", "\u0301",
	"<s>", "</s>", "<|endoftext|>", "\x00", "~",
}

// TestRoundTripRandom: Decode(Encode(s)) == s for random valid UTF-8 text,
// on both real vocabularies, with special-token text left as text.
func TestRoundTripRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, name := range []string{"tokenizer/ggml-vocab-llama-spm.gguf", "tokenizer/ggml-vocab-gpt-2.gguf"} {
		tok := load(t, name)
		for range 500 {
			var sb strings.Builder
			for range rng.IntN(30) + 1 {
				sb.WriteString(roundTripAtoms[rng.IntN(len(roundTripAtoms))])
			}
			s := sb.String()
			ids, err := tok.Encode(s, EncodeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if d := tok.Decode(ids); d != s {
				t.Fatalf("%s: Decode(Encode(%q)) = %q (ids %v)", name, s, d, ids)
			}
			var streamed strings.Builder
			st := tok.NewStream()
			for _, id := range ids {
				streamed.WriteString(st.Add(id))
			}
			streamed.WriteString(st.Flush())
			want := s
			if tok.Model() == "llama" {
				want = " " + s
			}
			if streamed.String() != want {
				t.Fatalf("%s: streamed %q want %q", name, streamed.String(), want)
			}
		}
	}
}

// FuzzRoundTrip runs the same property on the byte-level BPE vocabulary for
// any valid UTF-8 input (`go test -fuzz FuzzRoundTrip`).
func FuzzRoundTrip(f *testing.F) {
	tok := load(f, "tokenizer/ggml-vocab-gpt-2.gguf")
	for _, s := range []string{"Hello, y'all!", "  \n\n 3333 日本", "\u00a0x\u3000"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		ids, err := tok.Encode(s, EncodeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if d := tok.Decode(ids); d != s {
			t.Fatalf("Decode(Encode(%q)) = %q", s, d)
		}
	})
}

// TestConcurrentUse: one Tokenizer shared by goroutines (run under -race).
func TestConcurrentUse(t *testing.T) {
	tok := load(t, "tokenizer/ggml-vocab-gpt-2.gguf")
	texts, want := vectors(t, "ggml-vocab-gpt-2.gguf")
	errs := make(chan string, 4)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < len(texts); i += 2 {
				ids, err := tok.Encode(texts[i], EncodeOptions{})
				if err != nil || !slices.Equal(ids, want[i]) || tok.Decode(ids) != texts[i] {
					errs <- texts[i]
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for s := range errs {
		t.Errorf("concurrent Encode of %q differs", s)
	}
}
