// Package chat renders a conversation into a prompt with a model's chat
// template (GGUF key tokenizer.chat_template).
//
// Chat templates are Jinja programs written for Hugging Face's tokenizers.
// Parse compiles the model's own template with a Jinja engine
// (github.com/ardanlabs/jinja) and Render runs it with the variables
// apply_chat_template passes (messages, tools, add_generation_prompt,
// bos_token, eos_token, raise_exception, strftime_now, tojson as Python
// writes it), so any template renders as the model was trained on it:
// testdata holds the real templates of the common families and their
// renderings by Python's Jinja2, which the tests match byte for byte.
//
// Parse also names the template's family when it recognises one (Family):
// the tool-call format the model answers in follows from it (see
// ParseToolCalls). A Template built from a Family alone, with no source,
// renders that family's format in Go, as before templates were compiled:
// Llama 2 ([INST] with <<SYS>>), Llama 3 (<|start_header_id|>), ChatML
// (<|im_start|>) and Mistral Instruct v0.1/v0.2 ([INST] without <<SYS>>).
package chat

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/ardanlabs/jinja"
)

// Message is one turn of a conversation. Role is "system", "user",
// "assistant" or "tool" (a tool's result, answering the assistant's call
// ToolCallID). An assistant turn that called tools lists them in ToolCalls.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
	// ToolCalls are the calls an assistant turn made (OpenAI's shape).
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// ToolCallID is, on a tool message, the id of the call it answers.
	ToolCallID string `json:"tool_call_id,omitempty"`
	// Name is, on a tool message, the function that produced it.
	Name string `json:"name,omitempty"`
	// Thinking is an assistant turn's reasoning, for templates that render
	// it (reasoning_content, thinking).
	Thinking string `json:"reasoning_content,omitempty"`
}

// Family is a chat format this package can render.
type Family string

// The families.
const (
	Llama2  Family = "llama2"
	Llama3  Family = "llama3"
	ChatML  Family = "chatml"
	Mistral Family = "mistral"
)

// Families recognised in a compiled template for their tool-call format;
// they have no Go renderer (a Template with one of them and no source
// cannot render).
const (
	// Llama31 is Llama 3.1/3.2/3.3: tools in the system or first user turn,
	// calls as {"name": …, "parameters": …} or <|python_tag|>.
	Llama31 Family = "llama3.1"
	// Hermes is Qwen 2.5/3, Hermes and others: <tool_call>{…}</tool_call>.
	Hermes Family = "hermes"
	// MistralTools is Mistral v0.3+, Nemo, Small: [TOOL_CALLS][…].
	MistralTools Family = "mistral-tools"
	// Gemma is Gemma's <start_of_turn> format.
	Gemma Family = "gemma"
	// Phi is Phi-3 (<|user|>) and Phi-4 (<|im_sep|>).
	Phi Family = "phi"
	// Harmony is gpt-oss: <|channel|>, calls to=functions.name.
	Harmony Family = "harmony"
	// DeepSeek is DeepSeek (<｜User｜>, <｜tool▁call▁begin｜>).
	DeepSeek Family = "deepseek"
	// Other is a template no family matched; it renders all the same.
	Other Family = "other"
)

// ErrNoTemplate is returned for a model whose file has no chat template.
var ErrNoTemplate = errors.New("chat: the model has no chat template (tokenizer.chat_template)")

// ErrUnsupported is wrapped by the error for a template this package does
// not recognise.
var ErrUnsupported = errors.New("chat: unsupported chat template")

// ErrConversation is wrapped by Render's errors about the messages
// themselves (roles, order): the caller's mistake, not the template's.
var ErrConversation = errors.New("chat: invalid conversation")

// Template is a chat template: a compiled Jinja source (from Parse), or a
// family rendered in Go (a Template literal with Family set).
type Template struct {
	Family Family
	// DefaultSystem is the system message a ChatML template inserts when
	// the conversation has none (Qwen2: "You are a helpful assistant.").
	// Only the Go renderer reads it; a compiled template writes its own.
	DefaultSystem string
	// Source is the template text Parse compiled; empty for a family
	// rendered in Go.
	Source string

	compiled *jinja.Template
}

// chatmlDefault finds a default system turn written by the template
// itself: '<|im_start|>system\n…<|im_end|>\n' inside a Jinja string. The
// newline may be an escape (\n) or a real newline, depending on how the
// template was stored.
var chatmlDefault = regexp.MustCompile(`'<\|im_start\|>system(?:\\n|\n)((?:[^'\\]|\\.)*?)<\|im_end\|>(?:\\n|\n)'`)

// Parse compiles a template's source and recognises its family. A source
// the Jinja engine cannot compile is an error wrapping ErrUnsupported.
// Templates are cached by source: the one returned may be shared, and is
// not to be modified.
func Parse(src string) (*Template, error) {
	if strings.TrimSpace(src) == "" {
		return nil, ErrNoTemplate
	}
	if t, ok := parsed.Load(src); ok {
		return t.(*Template), nil
	}
	c, err := compile(src)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnsupported, err)
	}
	t := &Template{Family: detect(src), Source: src, compiled: c}
	if t.Family == ChatML {
		if m := chatmlDefault.FindStringSubmatch(src); m != nil {
			t.DefaultSystem = unescape(m[1])
		}
	}
	if parsedN.Add(1) <= maxParsed {
		parsed.Store(src, t)
	}
	return t, nil
}

// parsed caches compiled templates by source: a server parses its models'
// templates on every chat request, and a compiled template is read-only
// (safe for concurrent renders). At most maxParsed are kept, so sources
// sent by clients (--chat-template files, tests) cannot grow it without
// bound.
var (
	parsed    sync.Map // source → *Template
	parsedN   atomic.Int64
	maxParsed int64 = 256
)

// detect names a template's family by the markers it writes.
func detect(src string) Family {
	has := func(s ...string) bool {
		for _, x := range s {
			if !strings.Contains(src, x) {
				return false
			}
		}
		return true
	}
	switch {
	case has("<|channel|>"):
		return Harmony
	case has("<｜tool▁call▁begin｜>") || has("<｜Assistant｜>"):
		return DeepSeek
	case has("<|start_header_id|>", "<|end_header_id|>"):
		if has("tools") || has("Cutting Knowledge Date") || has("<|python_tag|>") {
			return Llama31
		}
		return Llama3
	case has("<tool_call>"):
		return Hermes
	case has("[TOOL_CALLS]") || has("[AVAILABLE_TOOLS]"):
		return MistralTools
	case has("<start_of_turn>"):
		return Gemma
	case has("<|im_sep|>") || has("<|user|>", "<|end|>"):
		return Phi
	case has("<|im_start|>"):
		return ChatML
	case has("[INST]", "<<SYS>>"):
		return Llama2
	case has("[INST]", "eos_token"):
		return Mistral
	}
	return Other
}

// unescape turns Jinja string escapes (\n, \', \\) into their characters.
func unescape(s string) string {
	r := strings.NewReplacer(`\n`, "\n", `\t`, "\t", `\'`, "'", `\"`, `"`, `\\`, `\`)
	return r.Replace(s)
}

// Options are the template's variables besides the messages.
type Options struct {
	BOS, EOS string // bos_token and eos_token, as text ("<s>", "</s>")
	// AddGenerationPrompt ends the prompt with the opening of an
	// assistant turn, for the model to complete.
	AddGenerationPrompt bool
	// Tools are the functions the model may call; the template renders
	// them (the tools variable is undefined when there are none).
	Tools []Tool
	// Now is strftime_now's clock (dated templates: Llama 3.2); zero is
	// the current time.
	Now time.Time
	// Vars are further template variables (enable_thinking,
	// reasoning_effort…), passed as apply_chat_template's keyword
	// arguments are; values are JSON-encodable.
	Vars map[string]any
}

// Segment is a piece of a rendered prompt: the template's own text
// (Content false), whose special tokens are meant, or a message's content
// (Content true), which is text whatever it contains: a user who writes
// "<|im_start|>system" must not open a system turn.
type Segment struct {
	Text    string
	Content bool
}

// Render writes the conversation as the model was trained to read it.
func (t *Template) Render(msgs []Message, o Options) (string, error) {
	segs, err := t.RenderSegments(msgs, o)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, sg := range segs {
		b.WriteString(sg.Text)
	}
	return b.String(), nil
}

// RenderSegments is Render split into template text and content, for a
// tokenizer to parse special tokens in the first only.
func (t *Template) RenderSegments(msgs []Message, o Options) ([]Segment, error) {
	if len(msgs) == 0 {
		return nil, fmt.Errorf("%w: no messages", ErrConversation)
	}
	c := t.compiled
	if c == nil && t.Source != "" {
		// A Template literal with a Source: compiled per call, as a
		// shared Template is never written to.
		var err error
		if c, err = compile(t.Source); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnsupported, err)
		}
	}
	if c != nil {
		for i, m := range msgs {
			switch m.Role {
			case "system", "user", "assistant", "tool":
			default:
				return nil, fmt.Errorf("%w: message %d: role %q is not system, user, assistant or tool", ErrConversation, i, m.Role)
			}
		}
		out, err := renderJinja(c, msgs, o)
		if errors.Is(err, ErrConversation) && goRenders(t.Family) {
			// The template refuses the conversation (Mistral v0.1/v0.2
			// reject a system message): its family's Go renderer writes
			// it as llama.cpp does (the system message before the first
			// user message), or says why not.
			return (&Template{Family: t.Family, DefaultSystem: t.DefaultSystem}).RenderSegments(msgs, o)
		}
		if err != nil {
			return nil, err
		}
		return locateContents(out, msgs), nil
	}
	for i, m := range msgs {
		switch m.Role {
		case "system", "user", "assistant":
		default:
			return nil, fmt.Errorf("%w: message %d: role %q is not system, user or assistant", ErrConversation, i, m.Role)
		}
	}
	var b segments
	switch t.Family {
	case Llama2:
		return b, renderLlama2(&b, msgs, o)
	case Llama3:
		renderLlama3(&b, msgs, o)
		return b, nil
	case ChatML:
		renderChatML(&b, msgs, o, t.DefaultSystem)
		return b, nil
	case Mistral:
		return b, renderMistral(&b, msgs, o)
	}
	return nil, fmt.Errorf("%w: family %q", ErrUnsupported, t.Family)
}

// goRenders reports whether a family has a Go renderer.
func goRenders(f Family) bool {
	switch f {
	case Llama2, Llama3, ChatML, Mistral:
		return true
	}
	return false
}

// segments builds a rendered prompt.
type segments []Segment

// tmpl appends template text.
func (b *segments) tmpl(s string) { b.add(s, false) }

// content appends message content.
func (b *segments) content(s string) { b.add(s, true) }

func (b *segments) add(s string, content bool) {
	if s == "" {
		return
	}
	if n := len(*b); n > 0 && (*b)[n-1].Content == content {
		(*b)[n-1].Text += s
		return
	}
	*b = append(*b, Segment{Text: s, Content: content})
}

// trimSpace is strings.TrimSpace over the concatenation of segs, keeping
// each byte in its segment.
func trimSpace(segs []Segment) []Segment {
	segs = slices.Clone(segs)
	for len(segs) > 0 {
		segs[0].Text = strings.TrimLeftFunc(segs[0].Text, unicode.IsSpace)
		if segs[0].Text != "" {
			break
		}
		segs = segs[1:]
	}
	for len(segs) > 0 {
		n := len(segs) - 1
		segs[n].Text = strings.TrimRightFunc(segs[n].Text, unicode.IsSpace)
		if segs[n].Text != "" {
			break
		}
		segs = segs[:n]
	}
	return segs
}

// splitSystem takes a leading system message off the conversation.
func splitSystem(msgs []Message) (system string, has bool, rest []Message) {
	if msgs[0].Role == "system" {
		return msgs[0].Content, true, msgs[1:]
	}
	return "", false, msgs
}

// alternate checks the user/assistant/user/… order the [INST] formats
// require (their templates raise an exception otherwise).
func alternate(msgs []Message) error {
	for i, m := range msgs {
		want := "user"
		if i%2 == 1 {
			want = "assistant"
		}
		if m.Role != want {
			return fmt.Errorf("%w: message %d is %q: roles must alternate user/assistant/user/… after an optional system message", ErrConversation, i, m.Role)
		}
	}
	return nil
}

// renderLlama2 is meta-llama/Llama-2-*-chat: every user turn is
// BOS "[INST] " content " [/INST]", every assistant turn " " content " " EOS;
// the system message goes into the first user turn inside <<SYS>> tags;
// contents are stripped (the template strips the tagged system message
// and the content together).
func renderLlama2(b *segments, msgs []Message, o Options) error {
	system, has, rest := splitSystem(msgs)
	if err := alternate(rest); err != nil {
		return err
	}
	for i, m := range rest {
		content := []Segment{{Text: m.Content, Content: true}}
		if i == 0 && has {
			content = []Segment{{"<<SYS>>\n", false}, {system, true}, {"\n<</SYS>>\n\n", false}, {m.Content, true}}
		}
		if m.Role == "user" {
			b.tmpl(o.BOS + "[INST] ")
		} else {
			b.tmpl(" ")
		}
		for _, sg := range trimSpace(content) {
			b.add(sg.Text, sg.Content)
		}
		if m.Role == "user" {
			b.tmpl(" [/INST]")
		} else {
			b.tmpl(" " + o.EOS)
		}
	}
	return nil
}

// renderLlama3 is Meta-Llama-3-*-Instruct: BOS, then per message a header
// with the role, a blank line, the trimmed content and <|eot_id|>.
func renderLlama3(b *segments, msgs []Message, o Options) {
	b.tmpl(o.BOS)
	for _, m := range msgs {
		b.tmpl("<|start_header_id|>" + m.Role + "<|end_header_id|>\n\n")
		b.content(strings.TrimSpace(m.Content))
		b.tmpl("<|eot_id|>")
	}
	if o.AddGenerationPrompt {
		b.tmpl("<|start_header_id|>assistant<|end_header_id|>\n\n")
	}
}

// renderChatML is <|im_start|>role\ncontent<|im_end|>\n per message,
// contents as they are; a template with a default system message puts it
// first when the conversation has none (that message is the template's
// own text).
func renderChatML(b *segments, msgs []Message, o Options, defaultSystem string) {
	if defaultSystem != "" && msgs[0].Role != "system" {
		b.tmpl("<|im_start|>system\n" + defaultSystem + "<|im_end|>\n")
	}
	for _, m := range msgs {
		b.tmpl("<|im_start|>" + m.Role + "\n")
		b.content(m.Content)
		b.tmpl("<|im_end|>\n")
	}
	if o.AddGenerationPrompt {
		b.tmpl("<|im_start|>assistant\n")
	}
}

// renderMistral is Mistral-7B-Instruct v0.1/v0.2: BOS, then "[INST] "
// content " [/INST]" per user turn and content EOS per assistant turn.
// Its template rejects system messages; as llama.cpp does, a system
// message is put in front of the first user message, separated by a
// newline.
func renderMistral(b *segments, msgs []Message, o Options) error {
	system, has, rest := splitSystem(msgs)
	if err := alternate(rest); err != nil {
		return err
	}
	b.tmpl(o.BOS)
	for i, m := range rest {
		if m.Role == "user" {
			b.tmpl("[INST] ")
			if i == 0 && has {
				b.content(system + "\n")
			}
			b.content(m.Content)
			b.tmpl(" [/INST]")
		} else {
			b.content(m.Content)
			b.tmpl(o.EOS)
		}
	}
	return nil
}
