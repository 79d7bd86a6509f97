package constrain

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"
)

// JSON Schema to grammar. The subset real tool schemas use is enforced
// exactly: type (one or a list), properties (kept in the schema's order),
// required, additionalProperties (false, or a schema for a map), enum,
// const, items, prefixItems, minItems/maxItems, minLength/maxLength,
// pattern, format (date, time, date-time, email, uuid, ipv4, hostname, uri;
// others are plain strings), integer and number bounds (exclusive bounds
// and non-integral number bounds are tightened to the nearest integers, a
// subset that always validates), anyOf/oneOf (alternatives; oneOf's
// "exactly one" is not checked), allOf of object schemas (merged), $ref to
// "#", #/$defs/… and #/definitions/…, and true/{} (any JSON value).
// Properties not declared are never generated, whatever
// additionalProperties says: output without them is valid either way.
//
// Whitespace between tokens is optional and bounded (a space, or a newline
// and up to 12 spaces), and numbers have at most 16 integer and fraction
// digits: unbounded filler is the one way a constrained model can still
// run away.

// JSONSchema compiles a JSON Schema document to a grammar for the JSON
// text of its instances.
func JSONSchema(schema []byte) (*Grammar, error) {
	c := NewConverter()
	name, err := c.AddSchema("root-schema", schema)
	if err != nil {
		return nil, err
	}
	return c.Grammar("root ::= " + name)
}

// JSONObject is the grammar of any JSON object (OpenAI's json_object
// mode, Ollama's format "json").
func JSONObject() *Grammar {
	g, err := NewConverter().Grammar("root ::= object")
	if err != nil {
		panic(fmt.Sprintf("constrain: the JSON object grammar does not compile: %v", err))
	}
	return g
}

// Converter turns JSON Schemas into GBNF rules that other rules can use:
// several schemas (one per tool, say) go into one grammar with the root
// rule the caller writes around them. The generic rules (value, object,
// array, string, number, integer, boolean, null, ws) are always there.
//
//	c := constrain.NewConverter()
//	args, err := c.AddSchema("weather-args", schema)
//	g, err := c.Grammar(`root ::= "<tool_call>{\"name\": \"get_weather\", \"arguments\": " ` + args + ` "}</tool_call>"`)
type Converter struct {
	rules  map[string]string // a reserved name maps to ""
	order  []string
	listed map[string]bool
	names  map[string]int
	// Per AddSchema: the document (for $ref) and the rules of its refs.
	doc  any
	refs map[string]string
}

// NewConverter returns a converter holding the generic JSON rules.
func NewConverter() *Converter {
	c := &Converter{rules: map[string]string{}, names: map[string]int{}, listed: map[string]bool{}}
	for _, r := range [][2]string{
		{"ws", `( " " | "\n" [ ]{0,12} )?`},
		{"value", `object | array | string | number | boolean | null`},
		{"object", `"{" ws ( string ":" ws value ws ( "," ws string ":" ws value ws )* )? "}"`},
		{"array", `"[" ws ( value ws ( "," ws value ws )* )? "]"`},
		{"string", `"\"" char* "\""`},
		{"char", `[^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )`},
		{"number", `"-"? int-part frac? exp?`},
		{"int-part", `"0" | [1-9] [0-9]{0,15}`},
		{"frac", `"." [0-9]{1,16}`},
		{"exp", `[eE] [-+]? [0-9]{1,2}`},
		{"integer", `"-"? int-part`},
		{"boolean", `"true" | "false"`},
		{"null", `"null"`},
	} {
		c.define(r[0], r[1])
	}
	return c
}

func (c *Converter) define(name, body string) {
	if !c.listed[name] {
		c.listed[name] = true
		c.order = append(c.order, name)
	}
	c.rules[name] = body
}

var ruleChars = regexp.MustCompile(`[^a-zA-Z0-9-]+`)

// newName returns an unused rule name based on base.
func (c *Converter) newName(base string) string {
	base = strings.Trim(ruleChars.ReplaceAllString(base, "-"), "-")
	if base == "" {
		base = "r"
	}
	for {
		c.names[base]++
		name := base
		if n := c.names[base]; n > 1 {
			name = fmt.Sprintf("%s-%d", base, n)
		}
		if _, ok := c.rules[name]; !ok {
			c.rules[name] = "" // reserved
			return name
		}
	}
}

// AddSchema adds the rules of schema and returns the name of the rule for
// its instances (based on name).
func (c *Converter) AddSchema(name string, schema []byte) (string, error) {
	doc, err := parseOrdered(schema)
	if err != nil {
		return "", fmt.Errorf("constrain: schema %s: %w", name, err)
	}
	c.doc, c.refs = doc, map[string]string{}
	rule := c.newName(name)
	body, err := c.visit(doc, rule, 0)
	if err != nil {
		return "", err
	}
	c.define(rule, body)
	return rule, nil
}

// GBNF is the converter's rules with root as the first line.
func (c *Converter) GBNF(root string) string {
	var sb strings.Builder
	sb.WriteString(strings.TrimSpace(root))
	sb.WriteByte('\n')
	for _, n := range c.order {
		fmt.Fprintf(&sb, "%s ::= %s\n", n, c.rules[n])
	}
	return sb.String()
}

// Grammar compiles the converter's rules under root, a GBNF rule
// definition of "root" that refers to them.
func (c *Converter) Grammar(root string) (*Grammar, error) {
	return ParseGBNF(c.GBNF(root))
}

// maxDepth bounds schema nesting (and $ref chains without progress).
const maxDepth = 64

// visit returns a GBNF expression for the instances of s.
func (c *Converter) visit(s any, name string, depth int) (string, error) {
	if depth > maxDepth {
		return "", fmt.Errorf("constrain: schema %s nests deeper than %d", name, maxDepth)
	}
	switch v := s.(type) {
	case bool:
		if v {
			return "value", nil
		}
		return "", fmt.Errorf("constrain: schema %s is false: nothing matches", name)
	case *object:
		return c.visitObject(v, name, depth)
	}
	return "", fmt.Errorf("constrain: schema %s is not an object or a boolean", name)
}

func (c *Converter) visitObject(s *object, name string, depth int) (string, error) {
	if ref, ok := s.str("$ref"); ok {
		return c.ref(ref, depth)
	}
	if v, ok := s.get("const"); ok {
		return Quote(encodeJSON(v)), nil
	}
	if v, ok := s.get("enum"); ok {
		vals, ok := v.([]any)
		if !ok || len(vals) == 0 {
			return "", fmt.Errorf("constrain: schema %s: enum is not a non-empty array", name)
		}
		alts := make([]string, len(vals))
		for i, x := range vals {
			alts[i] = Quote(encodeJSON(x))
		}
		return "(" + strings.Join(alts, " | ") + ")", nil
	}
	for _, kw := range []string{"anyOf", "oneOf"} {
		if v, ok := s.get(kw); ok {
			branches, ok := v.([]any)
			if !ok || len(branches) == 0 {
				return "", fmt.Errorf("constrain: schema %s: %s is not a non-empty array", name, kw)
			}
			rest := s.without(kw)
			var alts []string
			for i, b := range branches {
				merged := b
				if bo, ok := b.(*object); ok && len(rest.keys) > 0 {
					merged = rest.merge(bo)
				}
				e, err := c.visit(merged, fmt.Sprintf("%s-%d", name, i), depth+1)
				if err != nil {
					return "", err
				}
				alts = append(alts, e)
			}
			return c.sub(name, strings.Join(alts, " | ")), nil
		}
	}
	if v, ok := s.get("allOf"); ok {
		parts, ok := v.([]any)
		if !ok {
			return "", fmt.Errorf("constrain: schema %s: allOf is not an array", name)
		}
		merged := s.without("allOf")
		for _, p := range parts {
			po, ok := p.(*object)
			if !ok {
				continue
			}
			if ref, ok := po.str("$ref"); ok {
				target, err := c.resolve(ref)
				if err != nil {
					return "", err
				}
				if po, ok = target.(*object); !ok {
					continue
				}
			}
			merged = merged.merge(po)
		}
		return c.visitObject(merged, name, depth+1)
	}
	if t, ok := s.get("type"); ok {
		if list, ok := t.([]any); ok {
			var alts []string
			for _, x := range list {
				ts, _ := x.(string)
				e, err := c.visitType(s, ts, name, depth)
				if err != nil {
					return "", err
				}
				alts = append(alts, e)
			}
			return c.sub(name, strings.Join(alts, " | ")), nil
		}
		ts, _ := t.(string)
		return c.visitType(s, ts, name, depth)
	}
	switch {
	case s.has("properties") || s.has("additionalProperties") || s.has("required"):
		return c.visitType(s, "object", name, depth)
	case s.has("items") || s.has("prefixItems"):
		return c.visitType(s, "array", name, depth)
	case s.has("pattern") || s.has("format") || s.has("minLength") || s.has("maxLength"):
		return c.visitType(s, "string", name, depth)
	}
	return "value", nil
}

// sub puts a non-trivial expression in a rule of its own.
func (c *Converter) sub(name, body string) string {
	n := c.newName(name)
	c.define(n, body)
	return n
}

func (c *Converter) resolve(ref string) (any, error) {
	if ref == "#" {
		return c.doc, nil
	}
	path, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return nil, fmt.Errorf("constrain: $ref %q: only references inside the document: %w", ref, ErrUnsupported)
	}
	cur := c.doc
	for _, part := range strings.Split(path, "/") {
		part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
		o, ok := cur.(*object)
		if !ok {
			return nil, fmt.Errorf("constrain: $ref %q does not resolve", ref)
		}
		if cur, ok = o.get(part); !ok {
			return nil, fmt.Errorf("constrain: $ref %q does not resolve", ref)
		}
	}
	return cur, nil
}

func (c *Converter) ref(ref string, depth int) (string, error) {
	if n, ok := c.refs[ref]; ok {
		return n, nil
	}
	target, err := c.resolve(ref)
	if err != nil {
		return "", err
	}
	base := ref[strings.LastIndexByte(ref, '/')+1:]
	if ref == "#" {
		base = "root-ref"
	}
	n := c.newName(base)
	c.refs[ref] = n
	body, err := c.visit(target, n, depth+1)
	if err != nil {
		return "", err
	}
	c.define(n, body)
	return n, nil
}

func (c *Converter) visitType(s *object, t, name string, depth int) (string, error) {
	switch t {
	case "object":
		return c.objectRule(s, name, depth)
	case "array":
		return c.arrayRule(s, name, depth)
	case "string":
		return c.stringRule(s, name)
	case "integer", "number":
		return c.numberRule(s, t == "integer", name)
	case "boolean":
		return "boolean", nil
	case "null":
		return "null", nil
	}
	return "", fmt.Errorf("constrain: schema %s: type %q: %w", name, t, ErrUnsupported)
}

func (c *Converter) objectRule(s *object, name string, depth int) (string, error) {
	props, _ := s.obj("properties")
	required := map[string]bool{}
	if r, ok := s.get("required"); ok {
		list, _ := r.([]any)
		for _, x := range list {
			if k, ok := x.(string); ok {
				required[k] = true
			}
		}
	}
	type prop struct {
		key  string
		expr string
		req  bool
	}
	var ps []prop
	addl, hasAddl := s.get("additionalProperties")
	declared := map[string]bool{}
	if props != nil {
		for _, k := range props.keys {
			declared[k] = true
			e, err := c.visit(props.vals[k], name+"-"+k, depth+1)
			if err != nil {
				return "", err
			}
			ps = append(ps, prop{k, e, required[k]})
		}
	}
	// Required names without a declaration take the additional schema.
	if r, ok := s.get("required"); ok {
		list, _ := r.([]any)
		for _, x := range list {
			k, _ := x.(string)
			if k == "" || declared[k] {
				continue
			}
			sch := any(true)
			if hasAddl {
				if b, ok := addl.(bool); !ok || b {
					sch = addl
				} else {
					return "", fmt.Errorf("constrain: schema %s requires %q, which additionalProperties false forbids", name, k)
				}
			}
			e, err := c.visit(sch, name+"-"+k, depth+1)
			if err != nil {
				return "", err
			}
			declared[k] = true
			ps = append(ps, prop{k, e, true})
		}
	}
	if len(ps) == 0 {
		// A map (additionalProperties a schema) or any object.
		val := "value"
		if hasAddl {
			if b, ok := addl.(bool); ok && !b {
				return `"{" ws "}"`, nil
			}
			e, err := c.visit(addl, name+"-value", depth+1)
			if err != nil {
				return "", err
			}
			val = e
		}
		pair := `string ":" ws ` + val + ` ws`
		lo, hi := s.int("minProperties", 0), s.int("maxProperties", -1)
		if hi == 0 {
			return `"{" ws "}"`, nil
		}
		if lo > maxRepeat || hi > maxRepeat || hi >= 0 && hi < lo {
			return "", fmt.Errorf("constrain: schema %s: minProperties %d, maxProperties %d: %w", name, lo, hi, ErrUnsupported)
		}
		// Keys are not kept distinct: a repeated key counts once, so only
		// the upper bound is safe to enforce by counting pairs, and a
		// lower bound above 1 is refused.
		if lo > 1 {
			return "", fmt.Errorf("constrain: schema %s: minProperties %d on a map: %w", name, lo, ErrUnsupported)
		}
		body := pair + ` ( "," ws ` + pair + ` )` + repetition(0, hi-1, hi >= 0)
		if lo == 0 {
			body = "( " + body + " )?"
		}
		return c.sub(name, `"{" ws `+body+` "}"`), nil
	}
	kv := func(p prop) string {
		return Quote(encodeJSON(p.key)) + ` ws ":" ws ` + p.expr + ` ws`
	}
	// rest[i][after]: properties i… given whether one was written before.
	n := len(ps)
	restName := func(i int, after bool) string {
		if i == n {
			return ""
		}
		suffix := "first"
		if after {
			suffix = "next"
		}
		return fmt.Sprintf("%s-p%d-%s", name, i, suffix)
	}
	// All-required tails need no rules of their own: write them inline.
	allReq := make([]bool, n+1)
	allReq[n] = true
	for i := n - 1; i >= 0; i-- {
		allReq[i] = allReq[i+1] && ps[i].req
	}
	var ref func(i int, after bool) string
	made := map[string]bool{}
	ref = func(i int, after bool) string {
		if i == n {
			return `""`
		}
		if allReq[i] {
			var parts []string
			for j := i; j < n; j++ {
				if after || j > i {
					parts = append(parts, `"," ws`)
				}
				parts = append(parts, kv(ps[j]))
			}
			return strings.Join(parts, " ")
		}
		rn := restName(i, after)
		if !made[rn] {
			made[rn] = true
			c.rules[rn] = "" // reserve before recursing
			comma := ""
			if after {
				comma = `"," ws `
			}
			body := comma + kv(ps[i]) + " " + ref(i+1, true)
			if !ps[i].req {
				body += " | " + ref(i+1, after)
			}
			c.define(rn, body)
		}
		return rn
	}
	return c.sub(name, `"{" ws `+ref(0, false)+` "}"`), nil
}

func (c *Converter) arrayRule(s *object, name string, depth int) (string, error) {
	minItems := s.int("minItems", 0)
	maxItems := s.int("maxItems", -1)
	var prefix []string
	if p, ok := s.get("prefixItems"); ok {
		list, _ := p.([]any)
		for i, x := range list {
			e, err := c.visit(x, fmt.Sprintf("%s-%d", name, i), depth+1)
			if err != nil {
				return "", err
			}
			prefix = append(prefix, e)
		}
	}
	item := "value"
	noMore := false
	if it, ok := s.get("items"); ok {
		if b, ok := it.(bool); ok && !b {
			noMore = true
		} else {
			e, err := c.visit(it, name+"-item", depth+1)
			if err != nil {
				return "", err
			}
			item = e
		}
	} else if len(prefix) > 0 {
		noMore = true // items not given: write just the tuple
	}
	if maxItems >= 0 && maxItems < len(prefix) {
		return "", fmt.Errorf("constrain: schema %s: maxItems %d below its %d prefixItems: %w", name, maxItems, len(prefix), ErrUnsupported)
	}
	if len(prefix) > 0 {
		parts := []string{`"[" ws`}
		for i, p := range prefix {
			if i > 0 {
				parts = append(parts, `"," ws`)
			}
			parts = append(parts, p+" ws")
		}
		if !noMore {
			lo := max(0, minItems-len(prefix))
			rep := repetition(lo, maxItems-len(prefix), maxItems >= 0)
			parts = append(parts, `( "," ws `+item+` ws )`+rep)
		} else if minItems > len(prefix) {
			return "", fmt.Errorf("constrain: schema %s: minItems %d beyond a closed tuple of %d: %w", name, minItems, len(prefix), ErrUnsupported)
		}
		parts = append(parts, `"]"`)
		return c.sub(name, strings.Join(parts, " ")), nil
	}
	if noMore || maxItems == 0 {
		if minItems > 0 {
			return "", fmt.Errorf("constrain: schema %s: minItems %d with no items allowed", name, minItems)
		}
		return `"[" ws "]"`, nil
	}
	if minItems > maxRepeat || maxItems > maxRepeat {
		return "", fmt.Errorf("constrain: schema %s: item counts above %d: %w", name, maxRepeat, ErrUnsupported)
	}
	tail := `( "," ws ` + item + ` ws )` + repetition(max(0, minItems-1), maxItems-1, maxItems >= 0)
	body := item + " ws " + tail
	if minItems == 0 {
		body = "( " + body + " )?"
	}
	return c.sub(name, `"[" ws `+body+` "]"`), nil
}

// repetition is a GBNF {lo,hi} suffix (bounded says hi is meaningful).
func repetition(lo, hi int, bounded bool) string {
	switch {
	case !bounded && lo == 0:
		return "*"
	case !bounded:
		return fmt.Sprintf("{%d,}", lo)
	case lo == hi:
		return fmt.Sprintf("{%d}", lo)
	}
	return fmt.Sprintf("{%d,%d}", lo, hi)
}

// formats are grammars of the string formats the validators check.
var formats = map[string]string{
	"date":      `year "-" ( ( "01" | "03" | "05" | "07" | "08" | "10" | "12" ) "-" day31 | ( "04" | "06" | "09" | "11" ) "-" day30 | "02" "-" day28 )`,
	"time":      `( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,6} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )`,
	"date-time": `fmt-date "T" fmt-time`,
	"email":     `[a-zA-Z0-9_%+-]{1,30} ( "." [a-zA-Z0-9_%+-]{1,15} ){0,2} "@" host-label ( "." host-label ){0,2} "." [a-z]{2,8}`,
	"uuid":      `[0-9a-f]{8} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{12}`,
	"ipv4":      `octet "." octet "." octet "." octet`,
	"hostname":  `host-label ( "." host-label ){0,3}`,
	"uri":       `"https://" host-label ( "." host-label ){0,2} "." [a-z]{2,8} ( "/" [a-zA-Z0-9._~-]{1,16} ){0,4}`,
}

var formatHelpers = [][2]string{
	{"year", `[0-9]{4}`},
	{"day28", `"0" [1-9] | "1" [0-9] | "2" [0-8]`},
	{"day30", `day28 | "29" | "30"`},
	{"day31", `day30 | "31"`},
	{"octet", `"25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9]? [0-9]`},
	{"host-label", `[a-z0-9] ( [a-z0-9-]{0,20} [a-z0-9] )?`},
}

func (c *Converter) format(f string) string {
	if _, ok := formats[f]; !ok {
		return ""
	}
	for _, h := range formatHelpers {
		if _, ok := c.rules[h[0]]; !ok {
			c.define(h[0], h[1])
		}
	}
	name := "fmt-" + f
	if _, ok := c.rules[name]; !ok {
		if f == "date-time" {
			c.format("date")
			c.format("time")
		}
		c.define(name, formats[f])
	}
	return name
}

func (c *Converter) stringRule(s *object, name string) (string, error) {
	if f, ok := s.str("format"); ok {
		if r := c.format(f); r != "" {
			return `"\"" ` + r + ` "\""`, nil
		}
	}
	if p, ok := s.str("pattern"); ok {
		e, err := regexToGBNF(p)
		if err != nil {
			return "", err
		}
		return c.sub(name, `"\"" `+e+` "\""`), nil
	}
	lo, hi := s.int("minLength", 0), s.int("maxLength", -1)
	if lo == 0 && hi < 0 {
		return "string", nil
	}
	if lo > maxRepeat || hi > maxRepeat {
		return "", fmt.Errorf("constrain: schema %s: string lengths above %d: %w", name, maxRepeat, ErrUnsupported)
	}
	if hi >= 0 && hi < lo {
		return "", fmt.Errorf("constrain: schema %s: maxLength %d below minLength %d", name, hi, lo)
	}
	return c.sub(name, `"\"" char`+repetition(lo, hi, hi >= 0)+` "\""`), nil
}

// bound is an integral bound of a number; excl says the bound itself is
// excluded.
type bound struct {
	v    int64
	excl bool
}

// numberRule writes integers and numbers with their bounds. A bound that
// is not an integer is tightened inward to the nearest one (inclusive: a
// subset of the allowed values, which always validates).
func (c *Converter) numberRule(s *object, integer bool, name string) (string, error) {
	var lo, hi *bound
	set := func(kw string, up, exclusive bool) error {
		v, ok := s.num(kw)
		if !ok {
			return nil
		}
		r := math.Ceil(v)
		if up {
			r = math.Floor(v)
		}
		if r != v {
			exclusive = false // tightened past the bound already
		}
		if math.Abs(r) > 1e17 {
			return fmt.Errorf("constrain: schema %s: %s %v: %w", name, kw, v, ErrUnsupported)
		}
		b := bound{int64(r), exclusive}
		if integer && b.excl { // integers: exclusive is inclusive ±1
			b.excl = false
			if up {
				b.v--
			} else {
				b.v++
			}
		}
		p := &lo
		if up {
			p = &hi
		}
		if *p == nil || up && (b.v < (*p).v || b.v == (*p).v && b.excl) || !up && (b.v > (*p).v || b.v == (*p).v && b.excl) {
			*p = &b
		}
		return nil
	}
	for _, b := range []struct {
		kw            string
		up, exclusive bool
	}{{"minimum", false, false}, {"exclusiveMinimum", false, true}, {"maximum", true, false}, {"exclusiveMaximum", true, true}} {
		if err := set(b.kw, b.up, b.exclusive); err != nil {
			return "", err
		}
	}
	if lo == nil && hi == nil {
		if integer {
			return "integer", nil
		}
		return "number", nil
	}
	if lo != nil && hi != nil && (lo.v > hi.v || lo.v == hi.v && (lo.excl || hi.excl)) {
		return "", fmt.Errorf("constrain: schema %s: bounds [%d, %d] hold no value the compiler writes: %w", name, lo.v, hi.v, ErrUnsupported)
	}
	var alts []string
	// Non-negative values: magnitudes from max(lo, 0) up to hi.
	if hi == nil || hi.v > 0 || hi.v == 0 && !hi.excl {
		a := bound{0, false}
		if lo != nil && (lo.v > 0 || lo.v == 0 && lo.excl) {
			a = *lo
		}
		alts = append(alts, magnitudes(a, hi, integer))
	}
	// Negative values: magnitudes from max(-hi, 0) (exclusive) down to -lo.
	if lo == nil || lo.v < 0 {
		a := bound{0, true}
		if hi != nil && hi.v < 0 || hi != nil && hi.v == 0 && hi.excl {
			a = bound{-hi.v, hi.excl}
		}
		var b *bound
		if lo != nil {
			b = &bound{-lo.v, lo.excl}
		}
		alts = append(alts, `"-" `+magnitudes(a, b, integer))
	}
	return c.sub(name, strings.Join(alts, " | ")), nil
}

// magnitudes matches the absolute values from a to b (b nil: unbounded),
// integers or, with integer false, decimals.
func magnitudes(a bound, b *bound, integer bool) string {
	frac := ` ( "." [0-9]{1,16} )?`
	if integer {
		frac = ""
	}
	var alts []string
	// Integer parts strictly between a and b take any fraction.
	first := a.v + 1
	if !integer && !a.excl || integer {
		first = a.v
		if integer && a.excl {
			first = a.v + 1
		}
	}
	switch {
	case b == nil:
		alts = append(alts, "( "+digitsFrom(first)+" )"+frac)
	default:
		last := b.v - 1
		if integer && !b.excl {
			last = b.v
		}
		if first <= last {
			alts = append(alts, "( "+digitRange(first, last)+" )"+frac)
		}
		if !integer && !b.excl && b.v > a.v {
			alts = append(alts, Quote(strconv.FormatInt(b.v, 10))+` ( "." "0"{1,4} )?`)
		}
		if !integer && a.v == b.v && !a.excl && !b.excl {
			alts = append(alts, Quote(strconv.FormatInt(a.v, 10))+` ( "." "0"{1,4} )?`)
		}
	}
	// a itself, excluded: only with a non-zero fraction.
	if !integer && a.excl && (b == nil || b.v > a.v) {
		alts = append(alts, Quote(strconv.FormatInt(a.v, 10))+` "." [0-9]{0,15} [1-9]`)
	}
	return "( " + strings.Join(alts, " | ") + " )"
}

// digitsFrom matches integers ≥ a (up to 18 digits).
func digitsFrom(a int64) string {
	s := strconv.FormatInt(a, 10)
	top := int64(math.Pow10(len(s))) - 1
	alts := []string{digitRange(a, top)}
	if len(s) < 18 {
		alts = append(alts, fmt.Sprintf(`[1-9] [0-9]{%d,17}`, len(s)))
	}
	return strings.Join(alts, " | ")
}

// digitRange matches the decimal integers in [a, b], 0 ≤ a ≤ b.
func digitRange(a, b int64) string {
	var alts []string
	for d := len(strconv.FormatInt(a, 10)); d <= len(strconv.FormatInt(b, 10)); d++ {
		lo, hi := int64(0), int64(math.Pow10(d))-1
		if d > 1 {
			lo = int64(math.Pow10(d - 1))
		}
		lo, hi = max(lo, a), min(hi, b)
		if lo > hi {
			continue
		}
		alts = append(alts, sameLength(strconv.FormatInt(lo, 10), strconv.FormatInt(hi, 10)))
	}
	return strings.Join(alts, " | ")
}

// sameLength matches the numbers from a to b, strings of one length.
func sameLength(a, b string) string {
	if a == b {
		return Quote(a)
	}
	if len(a) == 1 {
		return fmt.Sprintf("[%c-%c]", a[0], b[0])
	}
	if a[0] == b[0] {
		return Quote(a[:1]) + " ( " + sameLength(a[1:], b[1:]) + " )"
	}
	rest := len(a) - 1
	zeros, nines := strings.Repeat("0", rest), strings.Repeat("9", rest)
	if a[1:] == zeros && b[1:] == nines {
		return fmt.Sprintf("[%c-%c] [0-9]{%d}", a[0], b[0], rest)
	}
	var alts []string
	lo, hi := a[0], b[0]
	if a[1:] != zeros {
		alts = append(alts, Quote(a[:1])+" ( "+sameLength(a[1:], nines)+" )")
		lo++
	}
	if b[1:] != nines {
		hi--
	}
	if lo <= hi {
		alts = append(alts, fmt.Sprintf("[%c-%c] [0-9]{%d}", lo, hi, rest))
	}
	if b[1:] != nines {
		alts = append(alts, Quote(b[:1])+" ( "+sameLength(zeros, b[1:])+" )")
	}
	return strings.Join(alts, " | ")
}

// object is a JSON object with its keys in document order (a schema's
// properties are generated in the order it declares them).
type object struct {
	keys []string
	vals map[string]any
}

func (o *object) get(k string) (any, bool) { v, ok := o.vals[k]; return v, ok }
func (o *object) has(k string) bool        { _, ok := o.vals[k]; return ok }

func (o *object) str(k string) (string, bool) {
	s, ok := o.vals[k].(string)
	return s, ok
}

func (o *object) obj(k string) (*object, bool) {
	s, ok := o.vals[k].(*object)
	return s, ok
}

func (o *object) num(k string) (float64, bool) {
	n, ok := o.vals[k].(json.Number)
	if !ok {
		return 0, false
	}
	f, err := n.Float64()
	return f, err == nil
}

func (o *object) int(k string, def int) int {
	f, ok := o.num(k)
	if !ok || f < 0 || f > math.MaxInt32 {
		return def
	}
	return int(f)
}

// without is a copy of o without key k.
func (o *object) without(k string) *object {
	out := &object{vals: map[string]any{}}
	for _, key := range o.keys {
		if key != k {
			out.keys = append(out.keys, key)
			out.vals[key] = o.vals[key]
		}
	}
	return out
}

// merge is o with p's keywords added: properties merged, required
// unioned, the rest taken from p.
func (o *object) merge(p *object) *object {
	out := o.without("")
	for _, k := range p.keys {
		v := p.vals[k]
		switch k {
		case "properties":
			if a, ok := out.vals[k].(*object); ok {
				if b, ok := v.(*object); ok {
					m := a.without("")
					for _, pk := range b.keys {
						if !m.has(pk) {
							m.keys = append(m.keys, pk)
						}
						m.vals[pk] = b.vals[pk]
					}
					v = m
				}
			}
		case "required":
			if a, ok := out.vals[k].([]any); ok {
				if b, ok := v.([]any); ok {
					v = append(append([]any(nil), a...), b...)
				}
			}
		}
		if !out.has(k) {
			out.keys = append(out.keys, k)
		}
		out.vals[k] = v
	}
	return out
}

// parseOrdered decodes JSON keeping object key order (numbers as
// json.Number).
func parseOrdered(data []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	v, err := decodeValue(d)
	if err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, fmt.Errorf("trailing data after the schema")
	}
	return v, nil
}

func decodeValue(d *json.Decoder) (any, error) {
	t, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch t := t.(type) {
	case json.Delim:
		switch t {
		case '{':
			o := &object{vals: map[string]any{}}
			for d.More() {
				kt, err := d.Token()
				if err != nil {
					return nil, err
				}
				k, _ := kt.(string)
				v, err := decodeValue(d)
				if err != nil {
					return nil, err
				}
				if !o.has(k) {
					o.keys = append(o.keys, k)
				}
				o.vals[k] = v
			}
			_, err := d.Token()
			return o, err
		case '[':
			var list []any
			for d.More() {
				v, err := decodeValue(d)
				if err != nil {
					return nil, err
				}
				list = append(list, v)
			}
			_, err := d.Token()
			if list == nil {
				list = []any{}
			}
			return list, err
		}
	}
	return t, nil
}

// encodeJSON writes a decoded value back as compact JSON.
func encodeJSON(v any) string {
	switch v := v.(type) {
	case *object:
		parts := make([]string, len(v.keys))
		for i, k := range v.keys {
			parts[i] = encodeJSON(k) + ":" + encodeJSON(v.vals[k])
		}
		return "{" + strings.Join(parts, ",") + "}"
	case []any:
		parts := make([]string, len(v))
		for i, x := range v {
			parts[i] = encodeJSON(x)
		}
		return "[" + strings.Join(parts, ",") + "]"
	case json.Number:
		return v.String()
	case nil:
		return "null"
	}
	var sb strings.Builder
	enc := json.NewEncoder(&sb)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // strings, booleans: cannot fail
	return strings.TrimSuffix(sb.String(), "\n")
}
