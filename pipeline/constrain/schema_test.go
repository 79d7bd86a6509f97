package constrain

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// testVocab is a vocabulary of every single byte (so partial UTF-8 and
// continuation bytes occur) plus multi-byte pieces like a real BPE
// vocabulary's, and one end-of-generation token (id 0).
func testVocab() *Vocab {
	pieces := [][]byte{nil} // 0: EOG
	for b := range 256 {
		pieces = append(pieces, []byte{byte(b)})
	}
	for _, s := range []string{`{"`, `"}`, `":`, `": "`, `", "`, `, "`, ` "`, `true`, `false`, `null`, `},`, `]}`, `[{`, `0`, `12`, `-1`, `.5`, `e+`,
		`é`, `こん`, `にちは`, "\xf0\x9f", "\x98\x80", `😀`, `\n`, `\"`, `\u00e9`, `abc`, `the`, ` the`, `ing`, `@example.com`, `2024-`, `T12:`, `:00Z`,
		"-01-", "Z", "://", "https", "  ", "\n  ", `"`, `ORD-`, `v1.`, `circle`, `{}`, `[]`, `",`, `"]`} {
		pieces = append(pieces, []byte(s))
	}
	return NewVocab(pieces, []int32{0})
}

// walk samples a random sentence: a uniformly random allowed token per
// step, within budget tokens.
func walk(t testing.TB, g *Grammar, v *Vocab, rng *rand.Rand, budget int) string {
	t.Helper()
	m := g.NewMatcher(v, budget)
	defer m.Close()
	var out []byte
	for step := 0; ; step++ {
		mask, err := m.Allowed()
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		var ids []int32
		for w, bits := range mask {
			for bits != 0 {
				i := int32(w*64) + int32(ctz(bits))
				bits &= bits - 1
				ids = append(ids, i)
			}
		}
		if len(ids) == 0 {
			t.Fatalf("step %d after %q: no token allowed", step, out)
		}
		id := ids[rng.IntN(len(ids))]
		if err := m.Accept(id); err != nil {
			t.Fatalf("step %d: accept %d: %v", step, id, err)
		}
		if slices.Contains(v.eog, id) {
			return string(out)
		}
		if step >= budget {
			t.Fatalf("token %d past the budget of %d: %q", step+1, budget, out)
		}
		p, _ := v.piece(id)
		out = append(out, p...)
	}
}

func ctz(x uint64) int {
	n := 0
	for x&1 == 0 {
		x >>= 1
		n++
	}
	return n
}

func compileValidator(t testing.TB, name string, schema []byte) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource(name, doc); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	s, err := c.Compile(name)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return s
}

func loadSchemas(t testing.TB) map[string][]byte {
	t.Helper()
	files, err := filepath.Glob("testdata/schemas/*.json")
	if err != nil || len(files) < 50 {
		t.Fatalf("want at least 50 schemas in testdata/schemas, found %d (%v)", len(files), err)
	}
	out := map[string][]byte{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimSuffix(filepath.Base(f), ".json")] = b
	}
	return out
}

// TestSchemasRandomWalk: random walks through every schema's grammar
// (any allowed token, uniformly) end with JSON that the reference
// validator accepts, formats asserted.
func TestSchemasRandomWalk(t *testing.T) {
	v := testVocab()
	for name, src := range loadSchemas(t) {
		t.Run(name, func(t *testing.T) {
			g, err := JSONSchema(src)
			if err != nil {
				t.Fatalf("compile: %v", err)
			}
			val := compileValidator(t, name+".json", src)
			rng := rand.New(rand.NewPCG(1, uint64(len(name))))
			for i := range 20 {
				budget := 150 + 40*i
				out := walk(t, g, v, rng, budget)
				var inst any
				if err := json.Unmarshal([]byte(out), &inst); err != nil {
					t.Fatalf("walk %d: %q does not parse: %v\n%s", i, out, err, g.GBNF())
				}
				inst, _ = jsonschema.UnmarshalJSON(strings.NewReader(out))
				if err := val.Validate(inst); err != nil {
					t.Fatalf("walk %d: %q does not validate: %v", i, out, err)
				}
				if !g.Accepts(out) {
					t.Fatalf("walk %d: the grammar does not accept its own output %q", i, out)
				}
			}
		})
	}
}
