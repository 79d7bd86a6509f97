package chat

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// goldenNow is render.py's pinned strftime_now clock.
var goldenNow = time.Date(2026, 11, 25, 17, 30, 0, 0, time.UTC)

type goldenSpec struct {
	Tools         []Tool `json:"tools"`
	Conversations map[string]struct {
		Tools    bool             `json:"tools"`
		Messages []map[string]any `json:"messages"`
	} `json:"conversations"`
}

// goldenMessages turns render.py's messages (arguments as objects, as
// transformers takes them) into Messages (arguments as JSON text, as
// OpenAI sends them).
func goldenMessages(t *testing.T, raw []map[string]any) []Message {
	t.Helper()
	var out []Message
	for _, orig := range raw {
		// A copy: the spec is shared by every template's run.
		var r map[string]any
		ob, _ := json.Marshal(orig)
		if err := json.Unmarshal(ob, &r); err != nil {
			t.Fatal(err)
		}
		if calls, ok := r["tool_calls"].([]any); ok {
			for _, c := range calls {
				f := c.(map[string]any)["function"].(map[string]any)
				b, err := json.Marshal(f["arguments"])
				if err != nil {
					t.Fatal(err)
				}
				f["arguments"] = string(b)
			}
		}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var m Message
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// TestGolden renders every template in testdata/templates (the models' own
// chat templates) with every conversation in testdata/conversations.json
// and compares with testdata/golden, written by Python's Jinja2 the way
// transformers' apply_chat_template renders (testdata/render.py): the
// prompt must be byte-identical, and a conversation the template refuses
// (raise_exception) must be refused here too.
func TestGolden(t *testing.T) {
	b, err := os.ReadFile("testdata/conversations.json")
	if err != nil {
		t.Fatal(err)
	}
	var spec goldenSpec
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("testdata/templates/*.jinja")
	if err != nil || len(files) < 20 {
		t.Fatalf("templates: %d, %v", len(files), err)
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".jinja")
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		tm, err := Parse(string(src))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		for conv, c := range spec.Conversations {
			t.Run(name+"/"+conv, func(t *testing.T) {
				o := Options{BOS: "<s>", EOS: "</s>", AddGenerationPrompt: true, Now: goldenNow}
				if c.Tools {
					o.Tools = spec.Tools
				}
				msgs := goldenMessages(t, c.Messages)
				got, err := renderJinja(tm.compiled, msgs, o)
				base := filepath.Join("testdata/golden", name, conv)
				if want, rerr := os.ReadFile(base + ".txt"); rerr == nil {
					if err != nil {
						t.Fatalf("error %v, want\n%s", err, want)
					}
					if got != string(want) {
						t.Fatalf("rendered\n%q\nwant\n%q", got, want)
					}
					segs, err := tm.RenderSegments(msgs, o)
					if err != nil {
						t.Fatal(err)
					}
					var all strings.Builder
					for _, s := range segs {
						all.WriteString(s.Text)
					}
					if all.String() != got {
						t.Fatalf("segments make\n%q\nwant\n%q", all.String(), got)
					}
					return
				}
				want, rerr := os.ReadFile(base + ".err")
				if rerr != nil {
					t.Fatalf("no golden: %v", rerr)
				}
				if !errors.Is(err, ErrConversation) || !strings.Contains(err.Error(), strings.TrimSpace(string(want))) {
					t.Fatalf("error %v, want the template's refusal %q", err, strings.TrimSpace(string(want)))
				}
			})
		}
	}
}

func parseFile(t testing.TB, name string) (*Template, error) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata/templates", name+".jinja"))
	if err != nil {
		return nil, err
	}
	return Parse(string(b))
}
