package chat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
)

// UnmarshalJSON takes arguments as OpenAI sends them (a string holding a
// JSON object) or as Ollama does (the object itself).
func (f *FunctionCall) UnmarshalJSON(b []byte) error {
	var raw struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	f.Name = raw.Name
	args := bytes.TrimSpace(raw.Arguments)
	switch {
	case len(args) == 0 || string(args) == "null":
		f.Arguments = ""
	case args[0] == '"':
		if err := json.Unmarshal(args, &f.Arguments); err != nil {
			return err
		}
	default:
		f.Arguments = string(args)
	}
	return nil
}

// ParseToolCalls finds the tool calls in a model's answer, in the format of
// its template's family, and returns the rest of the answer as content:
//
//   - Hermes (Qwen 2.5/3, Hermes, and any template that writes <tool_call>):
//     <tool_call>{"name": …, "arguments": {…}}</tool_call>, one or more.
//   - Llama 3.1+: the answer is {"name": …, "parameters": {…}} (or
//     "arguments"), possibly after <|python_tag|>; several separated by ";".
//   - Mistral v0.3+/Nemo: [TOOL_CALLS][{"name": …, "arguments": {…}}, …];
//     Mistral Small 3.2+: [TOOL_CALLS]name[ARGS]{…}.
//   - Harmony (gpt-oss): … to=functions.name …<|message|>{…}<|call|>.
//   - DeepSeek: <｜tool▁call▁begin｜>function<｜tool▁sep｜>name
//     ```json {…} ```<｜tool▁call▁end｜>.
//
// Other families are tried with the Hermes tags and then as a bare JSON
// call. An answer with no recognisable call is all content. Arguments are
// returned as JSON text; ids are left empty for the caller to assign.
func ParseToolCalls(f Family, out string) (content string, calls []ToolCall) {
	switch f {
	case Harmony:
		return parseHarmony(out)
	case DeepSeek:
		return parseDeepSeek(out)
	case MistralTools:
		if c, calls := parseMistral(out); calls != nil {
			return c, calls
		}
	case Llama31, Llama3:
		if c, calls := parseBareJSON(out); calls != nil {
			return c, calls
		}
	}
	if c, calls := parseHermes(out); calls != nil {
		return c, calls
	}
	return parseBareJSON(out)
}

// callJSON is a call as models write it.
type callJSON struct {
	Name       string          `json:"name"`
	Arguments  json.RawMessage `json:"arguments"`
	Parameters json.RawMessage `json:"parameters"`
	Function   *struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

// call turns a written call into a ToolCall; ok is false for JSON that is
// not a call (no name).
func (c callJSON) call() (ToolCall, bool) {
	name, args := c.Name, c.Arguments
	if len(args) == 0 {
		args = c.Parameters
	}
	if name == "" && c.Function != nil {
		name, args = c.Function.Name, c.Function.Arguments
	}
	if name == "" {
		return ToolCall{}, false
	}
	return ToolCall{Type: "function", Function: FunctionCall{Name: name, Arguments: argsText(args)}}, true
}

// argsText is a call's arguments as compact JSON text: an object as it is,
// a string holding JSON decoded first (some models write them quoted).
func argsText(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "{}"
	}
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			raw = []byte(s)
		}
	}
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return string(raw)
	}
	return b.String()
}

// parseCall reads one call written as a JSON object.
func parseCall(s string) (ToolCall, bool) {
	var c callJSON
	if err := json.Unmarshal([]byte(strings.TrimSpace(s)), &c); err != nil {
		return ToolCall{}, false
	}
	return c.call()
}

var hermesCall = regexp.MustCompile(`(?s)<tool_call>\s*(.*?)\s*(?:</tool_call>|$)`)

func parseHermes(out string) (string, []ToolCall) {
	ms := hermesCall.FindAllStringSubmatchIndex(out, -1)
	if ms == nil {
		return out, nil
	}
	var calls []ToolCall
	var rest strings.Builder
	prev := 0
	for _, m := range ms {
		c, ok := parseCall(out[m[2]:m[3]])
		if !ok {
			return out, nil
		}
		calls = append(calls, c)
		rest.WriteString(out[prev:m[0]])
		prev = m[1]
	}
	rest.WriteString(out[prev:])
	return strings.TrimSpace(rest.String()), calls
}

// parseBareJSON reads an answer that is a call (or calls separated by ";"
// or newlines), possibly after <|python_tag|>, as Llama 3.1+ answers.
func parseBareJSON(out string) (string, []ToolCall) {
	s := strings.TrimSpace(out)
	s = strings.TrimSpace(strings.TrimPrefix(s, "<|python_tag|>"))
	if !strings.HasPrefix(s, "{") {
		return out, nil
	}
	dec := json.NewDecoder(strings.NewReader(s))
	var calls []ToolCall
	for {
		var c callJSON
		if err := dec.Decode(&c); err != nil {
			break
		}
		tc, ok := c.call()
		if !ok {
			return out, nil
		}
		calls = append(calls, tc)
		// Skip a ";" separator.
		rest := strings.TrimLeft(s[dec.InputOffset():], " \t\r\n;")
		if rest == "" {
			return "", calls
		}
		s = rest
		dec = json.NewDecoder(strings.NewReader(s))
	}
	return out, nil
}

var mistralArgs = regexp.MustCompile(`(?s)\[TOOL_CALLS\]\s*([A-Za-z0-9_.\-]+)\s*\[ARGS\]\s*`)

func parseMistral(out string) (string, []ToolCall) {
	i := strings.Index(out, "[TOOL_CALLS]")
	if i < 0 {
		return out, nil
	}
	content := strings.TrimSpace(out[:i])
	body := strings.TrimSpace(out[i+len("[TOOL_CALLS]"):])
	if strings.HasPrefix(body, "[") {
		var list []callJSON
		dec := json.NewDecoder(strings.NewReader(body))
		if err := dec.Decode(&list); err != nil {
			return out, nil
		}
		var calls []ToolCall
		for _, c := range list {
			tc, ok := c.call()
			if !ok {
				return out, nil
			}
			calls = append(calls, tc)
		}
		return content, calls
	}
	// [TOOL_CALLS]name[ARGS]{…}, repeated.
	var calls []ToolCall
	rest := out[i:]
	for {
		m := mistralArgs.FindStringSubmatchIndex(rest)
		if m == nil || m[0] != 0 {
			break
		}
		dec := json.NewDecoder(strings.NewReader(rest[m[1]:]))
		var args json.RawMessage
		if err := dec.Decode(&args); err != nil {
			return out, nil
		}
		calls = append(calls, ToolCall{Type: "function", Function: FunctionCall{Name: rest[m[2]:m[3]], Arguments: argsText(args)}})
		rest = strings.TrimSpace(rest[m[1]+int(dec.InputOffset()):])
	}
	if calls == nil {
		return out, nil
	}
	return content, calls
}

var harmonyCall = regexp.MustCompile(`(?s)to=functions\.([A-Za-z0-9_.\-]+)[^<]*(?:<\|channel\|>[^<]*)?(?:<\|constrain\|>[^<]*)?<\|message\|>(.*?)(?:<\|call\|>|<\|end\|>|$)`)
var harmonyFinal = regexp.MustCompile(`(?s)<\|channel\|>final<\|message\|>(.*?)(?:<\|end\|>|<\|return\|>|$)`)

func parseHarmony(out string) (string, []ToolCall) {
	var calls []ToolCall
	for _, m := range harmonyCall.FindAllStringSubmatch(out, -1) {
		calls = append(calls, ToolCall{Type: "function", Function: FunctionCall{Name: m[1], Arguments: argsText(json.RawMessage(strings.TrimSpace(m[2])))}})
	}
	content := out
	if m := harmonyFinal.FindStringSubmatch(out); m != nil {
		content = m[1]
	} else if calls != nil {
		content = ""
	}
	return strings.TrimSpace(content), calls
}

var deepseekCall = regexp.MustCompile("(?s)<｜tool▁call▁begin｜>\\s*(?:function)?\\s*<｜tool▁sep｜>\\s*([^\\n`<]+?)\\s*\\n?\\s*(?:```(?:json)?\\s*)?(\\{.*?\\})\\s*(?:```)?\\s*<｜tool▁call▁end｜>")

func parseDeepSeek(out string) (string, []ToolCall) {
	ms := deepseekCall.FindAllStringSubmatch(out, -1)
	if ms == nil {
		return parseHermes(out)
	}
	var calls []ToolCall
	for _, m := range ms {
		calls = append(calls, ToolCall{Type: "function", Function: FunctionCall{Name: strings.TrimSpace(m[1]), Arguments: argsText(json.RawMessage(m[2]))}})
	}
	content := out
	if i := strings.Index(out, "<｜tool▁calls▁begin｜>"); i >= 0 {
		content = out[:i]
	} else if i := strings.Index(out, "<｜tool▁call▁begin｜>"); i >= 0 {
		content = out[:i]
	}
	return strings.TrimSpace(content), calls
}

// ToolCallText writes a call as a model of the family would, the inverse
// of ParseToolCalls: what a forced or constrained answer must be for the
// call to parse back. Families without a format of their own get Hermes'.
func ToolCallText(f Family, c ToolCall) (string, error) {
	args := strings.TrimSpace(c.Function.Arguments)
	if args == "" {
		args = "{}"
	}
	if !json.Valid([]byte(args)) {
		return "", fmt.Errorf("chat: tool call %s: arguments are not JSON", c.Function.Name)
	}
	name, err := json.Marshal(c.Function.Name)
	if err != nil {
		return "", err
	}
	switch f {
	case Llama31, Llama3:
		return `{"name": ` + string(name) + `, "parameters": ` + args + `}`, nil
	case MistralTools:
		return `[TOOL_CALLS][{"name": ` + string(name) + `, "arguments": ` + args + `}]`, nil
	case Harmony:
		return "<|channel|>commentary to=functions." + c.Function.Name + " <|constrain|>json<|message|>" + args + "<|call|>", nil
	}
	return "<tool_call>\n" + `{"name": ` + string(name) + `, "arguments": ` + args + "}\n</tool_call>", nil
}
