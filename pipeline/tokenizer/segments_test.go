package tokenizer

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

// Control-token text inside a segment that does not parse specials is
// plain text; the segments encode as the one string they make.
func TestEncodeSegments(t *testing.T) {
	tok := load(t, "stories260K-F32.gguf")
	eos := tok.EOS()
	segs := []Segment{{"[INST] ", true}, {"</s> hi <s>", false}, {" [/INST]</s>", true}}
	got, err := tok.EncodeSegments(t.Context(), segs, EncodeOptions{AddBOS: true})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := tok.Encode("[INST] </s> hi <s> [/INST]", EncodeOptions{AddBOS: true})
	if err != nil {
		t.Fatal(err)
	}
	want := append(slices.Clone(plain), eos)
	if !slices.Equal(got, want) {
		t.Errorf("segments %v, want %v", got, want)
	}
	if n := strings.Count(tok.Decode(got), "</s>"); slices.Index(got[:len(got)-1], eos) >= 0 || slices.Index(got[1:], tok.BOS()) >= 0 || n != 1 {
		t.Errorf("content's </s> or <s> became a control token: %v (%d </s> in the text)", got, n)
	}
	parsed, _ := tok.Encode("[INST] </s> hi", EncodeOptions{ParseSpecial: true})
	if slices.Index(parsed, eos) < 0 {
		t.Errorf("with ParseSpecial, </s> is not EOS: %v", parsed)
	}
}

// A cancelled context ends a long encoding with its error.
func TestEncodeContextCancelled(t *testing.T) {
	tok := load(t, "stories260K-F32.gguf")
	text := strings.Repeat("once upon a time ", 4*checkEvery)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := tok.EncodeContext(ctx, text, EncodeOptions{}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	if _, err := tok.EncodeSegments(ctx, []Segment{{text, false}}, EncodeOptions{}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled segments: %v", err)
	}
	ids, err := tok.EncodeContext(context.Background(), text, EncodeOptions{})
	if err != nil || len(ids) < 4*checkEvery {
		t.Errorf("live context: %d ids, %v", len(ids), err)
	}
}
