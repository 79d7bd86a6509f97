// Package chat renders a conversation into a prompt with a model's chat
// template (GGUF key tokenizer.chat_template).
//
// Chat templates are Jinja programs written for Hugging Face's tokenizers.
// Rather than embed a Jinja engine, this package does what llama.cpp's
// llama_chat_apply_template does: it recognises the template of a known
// family by its markers (the special tokens and phrases it writes) and
// renders that family's format in Go. A template it does not recognise is
// an error that says so, never a guess.
//
// Families: Llama 2 ([INST] with <<SYS>>), Llama 3 (<|start_header_id|>),
// ChatML as used by Qwen2/2.5, OpenHermes and others (<|im_start|>, with
// the template's default system message when it has one), and Mistral
// Instruct v0.1/v0.2 ([INST] without <<SYS>>).
package chat

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode"
)

// Message is one turn of a conversation. Role is "system", "user" or
// "assistant".
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
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

// ErrNoTemplate is returned for a model whose file has no chat template.
var ErrNoTemplate = errors.New("chat: the model has no chat template (tokenizer.chat_template)")

// ErrUnsupported is wrapped by the error for a template this package does
// not recognise.
var ErrUnsupported = errors.New("chat: unsupported chat template")

// ErrConversation is wrapped by Render's errors about the messages
// themselves (roles, order): the caller's mistake, not the template's.
var ErrConversation = errors.New("chat: invalid conversation")

// Template is a recognised chat template.
type Template struct {
	Family Family
	// DefaultSystem is the system message a ChatML template inserts when
	// the conversation has none (Qwen2: "You are a helpful assistant.").
	DefaultSystem string
}

// chatmlDefault finds a default system turn written by the template
// itself: '<|im_start|>system\n…<|im_end|>\n' inside a Jinja string. The
// newline may be an escape (\n) or a real newline, depending on how the
// template was stored.
var chatmlDefault = regexp.MustCompile(`'<\|im_start\|>system(?:\\n|\n)((?:[^'\\]|\\.)*?)<\|im_end\|>(?:\\n|\n)'`)

// Parse recognises a template's family from its text.
func Parse(src string) (*Template, error) {
	if strings.TrimSpace(src) == "" {
		return nil, ErrNoTemplate
	}
	switch {
	case strings.Contains(src, "<|start_header_id|>") && strings.Contains(src, "<|end_header_id|>"):
		if strings.Contains(src, "Cutting Knowledge Date") || strings.Contains(src, "tools") {
			// Llama 3.1+ write a dated system header and tool
			// definitions; rendering them without Jinja would guess.
			return nil, fmt.Errorf("%w: Llama 3.1+ template (dated system header, tools)", ErrUnsupported)
		}
		return &Template{Family: Llama3}, nil
	case strings.Contains(src, "<|im_start|>"):
		t := &Template{Family: ChatML}
		if m := chatmlDefault.FindStringSubmatch(src); m != nil {
			t.DefaultSystem = unescape(m[1])
		}
		return t, nil
	case strings.Contains(src, "[INST]") && strings.Contains(src, "<<SYS>>"):
		return &Template{Family: Llama2}, nil
	case strings.Contains(src, "[INST]") && strings.Contains(src, "eos_token"):
		if strings.Contains(src, "[AVAILABLE_TOOLS]") || strings.Contains(src, "[SYSTEM_PROMPT]") {
			return nil, fmt.Errorf("%w: Mistral v0.3+ template (tools, system prompt tokens)", ErrUnsupported)
		}
		return &Template{Family: Mistral}, nil
	}
	head := src
	if len(head) > 60 {
		head = head[:60] + "…"
	}
	return nil, fmt.Errorf("%w: not Llama 2, Llama 3, ChatML or Mistral (starts %q)", ErrUnsupported, head)
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
