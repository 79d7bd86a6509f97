package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// The Jinja path renders the model's own template, as Hugging Face's
// apply_chat_template does (github.com/ardanlabs/jinja applies HF's
// trim_blocks and lstrip_blocks). Three things differ from that engine's
// defaults and are handled here:
//
//   - tojson: the engine's filter sorts the keys of an indented object and
//     escapes <, > and & (Go's json); Python's json.dumps keeps insertion
//     order and writes them as they are. Filters cannot be replaced, so
//     compile rewrites "operand | tojson(...)" into a call of our own
//     forge_tojson(operand, ...) whose output is json.dumps's, byte for byte.
//   - strftime_now reads Options.Now, so a rendering is reproducible.
//   - raise_exception's error is recognised and wrapped in ErrConversation:
//     it is the template refusing the messages, the caller's mistake.
var tojsonFilter = regexp.MustCompile(
	// A primary operand: a name with attribute, index and call suffixes,
	// or a string literal. Filters bind tighter than any operator, so the
	// rewrite keeps the expression's meaning.
	`((?:[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*|\[[^\[\]]*\]|\(\))*)|'[^']*'|"[^"]*")\s*\|\s*tojson\b(\(([^()]*)\))?`)

const tojsonName = "forge_tojson"

// compile parses a template source with the engine.
func compile(src string) (*jinja.Template, error) {
	src = tojsonFilter.ReplaceAllStringFunc(src, func(m string) string {
		sub := tojsonFilter.FindStringSubmatch(m)
		args := strings.TrimSpace(sub[3])
		if args != "" {
			return tojsonName + "(" + sub[1] + ", " + args + ")"
		}
		return tojsonName + "(" + sub[1] + ")"
	})
	return jinja.Compile(src)
}

// raised marks raise_exception's message in the error the engine returns.
const raised = "\x00forge-raise\x00"

// renderJinja renders msgs with a compiled template.
func renderJinja(t *jinja.Template, msgs []Message, o Options) (string, error) {
	data, err := templateData(msgs, o)
	if err != nil {
		return "", err
	}
	out, err := t.RenderValues(data)
	if err != nil {
		msg := err.Error()
		if i := strings.Index(msg, raised); i >= 0 {
			return "", fmt.Errorf("%w: the template refuses it: %s", ErrConversation, strings.ReplaceAll(msg[i+len(raised):], raised, ""))
		}
		// The template itself failed (a construct the engine does not
		// support, a type error): not the conversation's fault.
		return "", fmt.Errorf("%w: rendering the template failed: %w", ErrUnsupported, err)
	}
	return out, nil
}

// templateData is the template's variables: what apply_chat_template
// passes (messages, tools, add_generation_prompt, bos_token, eos_token,
// the caller's extra variables) and the functions HF adds.
func templateData(msgs []Message, o Options) (map[string]jinja.Value, error) {
	list := make([]jinja.Value, 0, len(msgs))
	for i, m := range msgs {
		v, err := messageValue(m)
		if err != nil {
			return nil, fmt.Errorf("%w: message %d: %w", ErrConversation, i, err)
		}
		list = append(list, v)
	}
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	data := map[string]jinja.Value{
		"messages":              jinja.NewList(list),
		"add_generation_prompt": jinja.NewBool(o.AddGenerationPrompt),
		"bos_token":             jinja.NewString(o.BOS),
		"eos_token":             jinja.NewString(o.EOS),
		"raise_exception": jinja.NewCallable("raise_exception", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
			msg := "raise_exception"
			if len(args) > 0 && args[0].IsString() {
				msg = args[0].AsString()
			}
			return jinja.Undefined(), errors.New(raised + msg)
		}),
		"strftime_now": jinja.NewCallable("strftime_now", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
			if len(args) != 1 || !args[0].IsString() {
				return jinja.Undefined(), errors.New("strftime_now: want one format string")
			}
			return jinja.NewString(strftime(now, args[0].AsString())), nil
		}),
		tojsonName: jinja.NewCallable("tojson", tojson),
	}
	if len(o.Tools) > 0 {
		b, err := json.Marshal(o.Tools)
		if err != nil {
			return nil, fmt.Errorf("chat: tools: %w", err)
		}
		v, err := jsonValue(b)
		if err != nil {
			return nil, fmt.Errorf("chat: tools: %w", err)
		}
		data["tools"] = v
	}
	for k, v := range o.Vars {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("chat: template variable %q: %w", k, err)
		}
		jv, err := jsonValue(b)
		if err != nil {
			return nil, fmt.Errorf("chat: template variable %q: %w", k, err)
		}
		data[k] = jv
	}
	return data, nil
}

// messageValue is one message as templates read it: the keys a message
// has in the OpenAI request (a template tests "'tool_calls' in message"),
// content always a string (OpenAI's null content of a call-only turn is
// "": several templates concatenate it and fail on None),
// a call's arguments as the object they encode (templates write them with
// tojson or iterate over them, as transformers expects).
func messageValue(m Message) (jinja.Value, error) {
	d := jinja.NewDict()
	md := d.AsDict()
	md.Set("role", jinja.NewString(m.Role))
	md.Set("content", jinja.NewString(m.Content))
	if m.Name != "" {
		md.Set("name", jinja.NewString(m.Name))
	}
	if m.ToolCallID != "" {
		md.Set("tool_call_id", jinja.NewString(m.ToolCallID))
	}
	if m.Thinking != "" {
		md.Set("reasoning_content", jinja.NewString(m.Thinking))
		md.Set("thinking", jinja.NewString(m.Thinking))
	}
	if len(m.ToolCalls) > 0 {
		calls := make([]jinja.Value, 0, len(m.ToolCalls))
		for j, c := range m.ToolCalls {
			cd := jinja.NewDict()
			cdd := cd.AsDict()
			if c.ID != "" {
				cdd.Set("id", jinja.NewString(c.ID))
			}
			typ := c.Type
			if typ == "" {
				typ = "function"
			}
			cdd.Set("type", jinja.NewString(typ))
			fd := jinja.NewDict()
			fdd := fd.AsDict()
			fdd.Set("name", jinja.NewString(c.Function.Name))
			args := strings.TrimSpace(c.Function.Arguments)
			if args == "" {
				args = "{}"
			}
			av, err := jsonValue([]byte(args))
			if err != nil {
				return jinja.Value{}, fmt.Errorf("tool call %d (%s): arguments are not JSON: %w", j, c.Function.Name, err)
			}
			fdd.Set("arguments", av)
			cdd.Set("function", fd)
			calls = append(calls, cd)
		}
		md.Set("tool_calls", jinja.NewList(calls))
	}
	return d, nil
}

// jsonValue decodes JSON into engine values, keeping object keys in their
// order (Python's dicts do, and tojson writes them back in it) and
// integers as integers.
func jsonValue(b []byte) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return jinja.Value{}, err
	}
	if _, err := dec.Token(); err == nil {
		return jinja.Value{}, errors.New("trailing data after the JSON value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder) (jinja.Value, error) {
	tok, err := dec.Token()
	if err != nil {
		return jinja.Value{}, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			d := jinja.NewDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return jinja.Value{}, err
				}
				v, err := decodeValue(dec)
				if err != nil {
					return jinja.Value{}, err
				}
				d.AsDict().Set(kt.(string), v)
			}
			_, err := dec.Token()
			return d, err
		case '[':
			var items []jinja.Value
			for dec.More() {
				v, err := decodeValue(dec)
				if err != nil {
					return jinja.Value{}, err
				}
				items = append(items, v)
			}
			_, err := dec.Token()
			return jinja.NewList(items), err
		}
		return jinja.Value{}, fmt.Errorf("unexpected %v", t)
	default:
		return jinja.FromGoValue(t), nil
	}
}

// tojson is transformers' tojson: json.dumps(x, ensure_ascii=False,
// indent=indent, separators=separators, sort_keys=sort_keys).
func tojson(args []jinja.Value, kw map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), errors.New("tojson: no value")
	}
	e := jsonEncoder{item: ", ", key: ": ", indent: -1}
	if v, ok := kw["indent"]; ok && v.IsInt() {
		e.indent = int(v.AsInt())
	} else if len(args) > 1 && args[1].IsInt() {
		e.indent = int(args[1].AsInt())
	}
	if e.indent >= 0 {
		e.item = ","
	}
	if v, ok := kw["separators"]; ok && v.IsList() && v.AsList().Len() == 2 {
		e.item, e.key = v.AsList().Get(0).AsString(), v.AsList().Get(1).AsString()
	}
	if v, ok := kw["sort_keys"]; ok {
		e.sort = v.IsTruthy()
	}
	if v, ok := kw["ensure_ascii"]; ok {
		e.ascii = v.IsTruthy()
	}
	if err := e.value(args[0], 0); err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(e.b.String()), nil
}

type jsonEncoder struct {
	b           strings.Builder
	item, key   string
	indent      int // -1: none
	sort, ascii bool
}

func (e *jsonEncoder) newline(depth int) {
	if e.indent < 0 {
		return
	}
	e.b.WriteByte('\n')
	e.b.WriteString(strings.Repeat(" ", e.indent*depth))
}

func (e *jsonEncoder) value(v jinja.Value, depth int) error {
	switch {
	case v.IsNone() || v.IsUndefined():
		e.b.WriteString("null")
	case v.IsBool():
		if v.AsBool() {
			e.b.WriteString("true")
		} else {
			e.b.WriteString("false")
		}
	case v.IsInt():
		e.b.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		e.b.WriteString(pyFloat(v.AsFloat()))
	case v.IsString():
		e.str(v.AsString())
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			e.b.WriteString("[]")
			return nil
		}
		e.b.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				e.b.WriteString(e.item)
			}
			e.newline(depth + 1)
			if err := e.value(it, depth+1); err != nil {
				return err
			}
		}
		e.newline(depth)
		e.b.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		keys := d.OrderedKeys()
		if e.sort {
			slices.Sort(keys)
		}
		if len(keys) == 0 {
			e.b.WriteString("{}")
			return nil
		}
		e.b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				e.b.WriteString(e.item)
			}
			e.newline(depth + 1)
			e.str(k)
			e.b.WriteString(e.key)
			val, _ := d.Get(k)
			if err := e.value(val, depth+1); err != nil {
				return err
			}
		}
		e.newline(depth)
		e.b.WriteByte('}')
	default:
		return fmt.Errorf("tojson: cannot encode %s", v.String())
	}
	return nil
}

// str writes a JSON string as Python's json.dumps does: \n, \r, \t, \b,
// \f, \" and \\ escaped, other control characters as \u00XX, and the rest
// as it is (ensure_ascii=False) or as \uXXXX escapes (ensure_ascii=True).
func (e *jsonEncoder) str(s string) {
	e.b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			e.b.WriteString(`\"`)
		case '\\':
			e.b.WriteString(`\\`)
		case '\n':
			e.b.WriteString(`\n`)
		case '\r':
			e.b.WriteString(`\r`)
		case '\t':
			e.b.WriteString(`\t`)
		case '\b':
			e.b.WriteString(`\b`)
		case '\f':
			e.b.WriteString(`\f`)
		default:
			switch {
			case r < 0x20 || (e.ascii && r > 0x7e):
				if r > 0xffff {
					r1, r2 := utf16Pair(r)
					fmt.Fprintf(&e.b, `\u%04x\u%04x`, r1, r2)
				} else {
					fmt.Fprintf(&e.b, `\u%04x`, r)
				}
			case r == utf8.RuneError:
				e.b.WriteRune(r)
			default:
				e.b.WriteRune(r)
			}
		}
	}
	e.b.WriteByte('"')
}

func utf16Pair(r rune) (rune, rune) {
	r -= 0x10000
	return 0xd800 + (r>>10)&0x3ff, 0xdc00 + r&0x3ff
}

// pyFloat formats a float as Python's repr does: the shortest digits that
// round-trip, with ".0" on integral values and an exponent from 1e16 on.
func pyFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	case math.IsNaN(f):
		return "NaN"
	}
	abs := math.Abs(f)
	if abs != 0 && (abs >= 1e16 || abs < 1e-4) {
		return strconv.FormatFloat(f, 'e', -1, 64) // 1e+16, 1.5e-05: as Python
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}

// strftime is the subset of C's strftime that templates use (Llama 3.2:
// "%d %b %Y"; others "%Y-%m-%d", "%B %d, %Y").
func strftime(t time.Time, f string) string {
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 == len(f) {
			b.WriteByte(f[i])
			continue
		}
		i++
		switch f[i] {
		case 'Y':
			fmt.Fprintf(&b, "%04d", t.Year())
		case 'y':
			fmt.Fprintf(&b, "%02d", t.Year()%100)
		case 'm':
			fmt.Fprintf(&b, "%02d", int(t.Month()))
		case 'd':
			fmt.Fprintf(&b, "%02d", t.Day())
		case 'e':
			fmt.Fprintf(&b, "%2d", t.Day())
		case 'b', 'h':
			b.WriteString(t.Month().String()[:3])
		case 'B':
			b.WriteString(t.Month().String())
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'H':
			fmt.Fprintf(&b, "%02d", t.Hour())
		case 'I':
			h := t.Hour() % 12
			if h == 0 {
				h = 12
			}
			fmt.Fprintf(&b, "%02d", h)
		case 'p':
			if t.Hour() < 12 {
				b.WriteString("AM")
			} else {
				b.WriteString("PM")
			}
		case 'M':
			fmt.Fprintf(&b, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", t.Second())
		case 'j':
			fmt.Fprintf(&b, "%03d", t.YearDay())
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(f[i])
		}
	}
	return b.String()
}

// locateContents splits a rendered prompt into template text and message
// content: each message's content (as the template may have trimmed it)
// is looked for in order after the previous one, and where found its bytes
// are content. A content the template transformed beyond trimming (split
// off a thinking block, escaped into JSON) is not found and stays template
// text: the prompt is the same either way, only special tokens written in
// such a content would be parsed as tokens.
func locateContents(out string, msgs []Message) []Segment {
	var b segments
	pos := 0
	for _, m := range msgs {
		c := strings.TrimSpace(m.Content)
		if c == "" {
			continue
		}
		i := strings.Index(out[pos:], c)
		if i < 0 {
			continue
		}
		b.tmpl(out[pos : pos+i])
		b.content(c)
		pos += i + len(c)
	}
	b.tmpl(out[pos:])
	return b
}
