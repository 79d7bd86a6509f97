package chat

import (
	"os"
	"testing"
	"time"
)

// BenchmarkCompile and BenchmarkRender: the cost of a chat request's
// template (compiled once per source, rendered per request), on Llama
// 3.1's template with tools and gpt-oss's, the largest under test.
func BenchmarkCompile(b *testing.B) {
	src, err := os.ReadFile("testdata/templates/openai-gpt-oss-120b.jinja")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := compile(string(src)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRender(b *testing.B) {
	for _, name := range []string{"meta-llama-Llama-3.1-8B-Instruct", "openai-gpt-oss-120b"} {
		b.Run(name, func(b *testing.B) {
			tm, err := parseFile(b, name)
			if err != nil {
				b.Fatal(err)
			}
			tools := []Tool{{Type: "function", Function: Function{Name: "get_weather", Description: "Weather.", Parameters: []byte(`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`)}}}
			msgs := []Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Weather in Paris?"}}
			o := Options{BOS: "<s>", EOS: "</s>", AddGenerationPrompt: true, Tools: tools, Now: time.Unix(0, 0)}
			for b.Loop() {
				if _, err := tm.RenderSegments(msgs, o); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
