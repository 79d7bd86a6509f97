package gpu

import (
	"maps"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf"
)

// TestParseMMQ: the defaults, off, variants per type (case-insensitive),
// and a refusal naming the setting for anything else.
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
	if mmqDefault[gguf.TypeQ4_K] != "-" {
		t.Errorf("ParseMMQ changed mmqDefault: %v", mmqDefault)
	}
	for _, bad := range []string{"on", "q4_k=x", "q8_0=p", "q4_k"} {
		if _, _, err := ParseMMQ(bad); err == nil || !strings.Contains(err.Error(), "mmq setting") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
