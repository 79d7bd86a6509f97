package pipeline

import (
	"strings"
	"unicode"

	"github.com/forge-llm/forge/pipeline/chat"
)

// toolStreamer decides, as the answer of a request with tools streams,
// which text is content to hand out now and which may be a tool call, to
// hold until the answer is whole and parsed. An answer that opens like a
// call in the model's format (Llama's JSON, <tool_call>, [TOOL_CALLS]…) is
// held whole; otherwise its text streams, up to the first call marker,
// from which the rest is held (Hermes models may write a sentence, then a
// call). Text that could still grow into a marker is held back meanwhile.
type toolStreamer struct {
	start []string // markers that make a call only at the answer's start
	any   []string // markers that open a call anywhere
	all   bool     // hold everything (harmony's channels)

	buf     strings.Builder
	emitted int  // bytes of buf handed out
	held    bool // a call opened: everything from emitted on is held
}

func newToolStreamer(f chat.Family) *toolStreamer {
	switch f {
	case chat.Harmony:
		return &toolStreamer{all: true}
	case chat.Llama31, chat.Llama3:
		return &toolStreamer{start: []string{"{", "<|python_tag|>"}, any: []string{"<|python_tag|>"}}
	case chat.MistralTools:
		return &toolStreamer{start: []string{"[TOOL_CALLS]"}, any: []string{"[TOOL_CALLS]"}}
	case chat.DeepSeek:
		return &toolStreamer{any: []string{"<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<tool_call>"}}
	}
	return &toolStreamer{start: []string{"{", "<tool_call>"}, any: []string{"<tool_call>"}}
}

// add takes the next text and returns what can be handed out now.
func (s *toolStreamer) add(text string) string {
	s.buf.WriteString(text)
	if s.all || s.held {
		return ""
	}
	all := s.buf.String()
	if s.emitted == 0 {
		lead := strings.TrimLeftFunc(all, unicode.IsSpace)
		if lead == "" {
			return ""
		}
		for _, m := range s.start {
			if strings.HasPrefix(lead, m) {
				s.held = true
				return ""
			}
			if strings.HasPrefix(m, lead) {
				return "" // could still be m
			}
		}
	}
	cut := len(all)
	for _, m := range s.any {
		from := max(0, s.emitted-len(m)+1)
		if i := strings.Index(all[from:], m); i >= 0 && from+i < cut {
			cut = from + i
			s.held = true
		}
	}
	if !s.held {
		// Hold back a tail that may grow into a marker.
		for _, m := range s.any {
			for n := min(len(m)-1, len(all)-s.emitted); n > 0; n-- {
				if strings.HasSuffix(all, m[:n]) {
					cut = min(cut, len(all)-n)
					break
				}
			}
		}
	}
	out := all[s.emitted:cut]
	s.emitted = cut
	return out
}

// finish parses the answer text past its first sent bytes (the content
// handed out while it streamed) and returns the answer's content (that
// prefix, then the content outside the calls) and the calls.
func (s *toolStreamer) finish(f chat.Family, text string, sent int) (string, []chat.ToolCall) {
	sent = min(sent, len(text))
	// Without calls, content is the held text as it is (harmony: its
	// final channel).
	content, calls := chat.ParseToolCalls(f, text[sent:])
	return text[:sent] + content, calls
}
