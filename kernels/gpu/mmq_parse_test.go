package gpu

import (
	"maps"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf"
)

// TestParseMMQ: the defaults (the 8-bit prompt product for Q4_0 alone),
// off, variants per type (case-insensitive), and a refusal naming the
// setting for anything else.
func TestParseMMQ(t *testing.T) {
	off, ch, err := ParseMMQ("")
	if err != nil || off || !maps.Equal(ch, mmqDefault) {
		t.Errorf(`"": off %v, %v, %v`, off, ch, err)
	}
	if off, _, err := ParseMMQ("off"); err != nil || !off {
		t.Errorf(`"off": off %v, %v`, off, err)
	}
	off, ch, err = ParseMMQ("Q4_K=p, q6_k=-")
	if err != nil || off || ch[gguf.TypeQ4_K] != "p" || ch[gguf.TypeQ6_K] != "-" {
		t.Errorf("variants: off %v, %v, %v", off, ch, err)
	}
	off, ch, err = ParseMMQ("q8_0=q8,Q4_0=f16")
	if err != nil || off || ch[gguf.TypeQ8_0] != "q8" || ch[gguf.TypeQ4_0] != "f16" || ch[gguf.TypeQ4_K] != "-" {
		t.Errorf("prompt products: off %v, %v, %v", off, ch, err)
	}
	if _, ch, _ := ParseMMQ(""); ch[gguf.TypeQ4_0] != "q8" || ch[gguf.TypeQ8_0] != "f16" || ch[gguf.TypeQ5_0] != "f16" {
		t.Errorf("default prompt products: %v; want 8-bit x for Q4_0 alone", ch)
	}
	if mmqDefault[gguf.TypeQ4_K] != "-" || mmqDefault[gguf.TypeQ8_0] != "f16" {
		t.Errorf("ParseMMQ changed mmqDefault: %v", mmqDefault)
	}
	for _, bad := range []string{"on", "q4_k=x", "q8_0=p", "q4_k", "q4_k=q8", "q6_k=f16", "f16=q8"} {
		if _, _, err := ParseMMQ(bad); err == nil || !strings.Contains(err.Error(), "mmq setting") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
