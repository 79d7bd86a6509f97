package pipeline

import (
	"strings"
	"testing"

	"github.com/forge-llm/forge/pipeline/chat"
)

// The streamer hands out content as it comes and holds what may be a
// call; the parsed answer begins with what was handed out.
func TestToolStreamer(t *testing.T) {
	cases := []struct {
		name     string
		f        chat.Family
		pieces   []string
		streamed string // handed out while streaming
		text     string // the answer's content
		calls    int
	}{
		{"hermes-call", chat.Hermes, []string{" <tool", "_call>\n{\"name\": \"f\", ", "\"arguments\": {}}\n</tool_call>"}, "", "", 1},
		{"hermes-text", chat.Hermes, []string{"It is ", "sunny <b>", "today."}, "It is sunny <b>today.", "It is sunny <b>today.", 0},
		{"hermes-text-then-call", chat.Hermes, []string{"Let me check.", "\n<tool_", "call>{\"name\": \"f\", \"arguments\": {}}</tool_call>"}, "Let me check.\n", "Let me check.\n", 1},
		{"hermes-json-text", chat.Hermes, []string{"{\"answer\"", ": 42}"}, "", "{\"answer\": 42}", 0},
		{"llama-call", chat.Llama31, []string{"{\"name\": \"f\", ", "\"parameters\": {\"a\": 1}}"}, "", "", 1},
		{"llama-text-brace", chat.Llama31, []string{"Sets like ", "{1, 2}", " are fine."}, "Sets like {1, 2} are fine.", "Sets like {1, 2} are fine.", 0},
		{"mistral-call", chat.MistralTools, []string{"[TOOL_", "CALLS][{\"name\": \"f\", \"arguments\": {}}]"}, "", "", 1},
		{"harmony", chat.Harmony, []string{"<|channel|>final<|message|>", "Hi"}, "", "Hi", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newToolStreamer(c.f)
			var out strings.Builder
			for _, p := range c.pieces {
				out.WriteString(s.add(p))
			}
			all := strings.Join(c.pieces, "")
			text, calls := s.finish(c.f, all, out.Len())
			if out.String() != c.streamed || text != c.text || len(calls) != c.calls || !strings.HasPrefix(text, out.String()) {
				t.Fatalf("streamed %q, text %q, %d calls; want %q, %q, %d", out.String(), text, len(calls), c.streamed, c.text, c.calls)
			}
		})
	}
}
