package constrain

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// maxRepeat bounds the counts of x{m,n}: each repetition is a grammar
// element, so a huge count is a huge grammar.
const maxRepeat = 4096

// ParseGBNF compiles a grammar in llama.cpp's GBNF syntax whose start rule
// is root:
//
//	root   ::= object
//	object ::= "{" ws ( pair ( "," ws pair )* )? "}"
//	pair   ::= [a-z]+ ":" ws [0-9]+   # comments run to the end of the line
//	ws     ::= [ \t\n]*
//
// Terminals are "literals" and [character classes] ([^…] negated, ranges,
// escapes \n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH) and . (any character);
// sequences, | alternatives, ( groups ), and the repetitions *, +, ?, {m},
// {m,} and {m,n}. A rule's body may span lines: it ends where the next
// "name ::=" begins. Left recursion is refused.
//
// Compiled grammars are kept by source (the 16 most recently compiled), so
// that requests with the same grammar or schema share one Grammar and its
// mask caches: an agent's tool schemas come back request after request.
func ParseGBNF(src string) (*Grammar, error) {
	compiled.Lock()
	if g, ok := compiled.m[src]; ok {
		compiled.Unlock()
		return g, nil
	}
	compiled.Unlock()
	g, err := parseGBNF(src, "root")
	if err != nil {
		return nil, err
	}
	compiled.Lock()
	defer compiled.Unlock()
	if prev, ok := compiled.m[src]; ok { // compiled alongside
		return prev, nil
	}
	if compiled.m == nil {
		compiled.m = map[string]*Grammar{}
	}
	if len(compiled.order) >= maxCompiled {
		delete(compiled.m, compiled.order[0])
		compiled.order = compiled.order[1:]
	}
	compiled.m[src] = g
	compiled.order = append(compiled.order, src)
	return g, nil
}

// compiled holds the recently compiled grammars by source.
var compiled struct {
	sync.Mutex
	m     map[string]*Grammar
	order []string
}

const maxCompiled = 16

func parseGBNF(src, root string) (*Grammar, error) {
	p := &gbnfParser{src: src, b: newBuilder(), defined: map[string]bool{}}
	if err := p.parse(); err != nil {
		return nil, err
	}
	g, err := p.b.finish(root, p.defined)
	if err != nil {
		return nil, err
	}
	g.text = src
	return g, nil
}

type gbnfParser struct {
	src     string
	pos     int
	b       *builder
	defined map[string]bool
}

func (p *gbnfParser) errorf(format string, a ...any) error {
	line := 1 + strings.Count(p.src[:p.pos], "\n")
	col := p.pos - strings.LastIndexByte(p.src[:p.pos], '\n')
	return fmt.Errorf("constrain: gbnf line %d column %d: %s", line, col, fmt.Sprintf(format, a...))
}

func isWordChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// skip passes blanks and comments, and newlines when nl.
func (p *gbnfParser) skip(nl bool) {
	for p.pos < len(p.src) {
		switch c := p.src[p.pos]; {
		case c == ' ' || c == '\t' || c == '\r':
			p.pos++
		case c == '\n' && nl:
			p.pos++
		case c == '#':
			for p.pos < len(p.src) && p.src[p.pos] != '\n' {
				p.pos++
			}
		default:
			return
		}
	}
}

func (p *gbnfParser) name() string {
	start := p.pos
	for p.pos < len(p.src) && isWordChar(p.src[p.pos]) {
		p.pos++
	}
	return p.src[start:p.pos]
}

// atDefinition reports whether "name ::=" starts at the current position.
func (p *gbnfParser) atDefinition() bool {
	save := p.pos
	defer func() { p.pos = save }()
	if p.name() == "" {
		return false
	}
	p.skip(false)
	return strings.HasPrefix(p.src[p.pos:], "::=")
}

func (p *gbnfParser) parse() error {
	for {
		p.skip(true)
		if p.pos >= len(p.src) {
			return nil
		}
		name := p.name()
		if name == "" {
			return p.errorf("expected a rule name, found %q", p.src[p.pos:p.pos+1])
		}
		p.skip(false)
		if !strings.HasPrefix(p.src[p.pos:], "::=") {
			return p.errorf("expected ::= after %q", name)
		}
		p.pos += 3
		if p.defined[name] {
			return p.errorf("rule %q defined twice", name)
		}
		p.defined[name] = true
		id := p.b.ruleID(name)
		p.skip(true)
		alts, err := p.alternates(name, false)
		if err != nil {
			return err
		}
		p.b.seqs[id] = alts
	}
}

func (p *gbnfParser) alternates(name string, nested bool) ([][]elem, error) {
	var alts [][]elem
	for {
		seq, err := p.sequence(name, nested)
		if err != nil {
			return nil, err
		}
		alts = append(alts, seq)
		if p.pos < len(p.src) && p.src[p.pos] == '|' {
			p.pos++
			p.skip(true)
			continue
		}
		return alts, nil
	}
}

func (p *gbnfParser) sequence(name string, nested bool) ([]elem, error) {
	var seq []elem
	last := -1 // start of the last term in seq
	for {
		p.skip(nested)
		if p.pos >= len(p.src) {
			return seq, nil
		}
		c := p.src[p.pos]
		if c == '\n' { // top level: a newline ends the rule unless the body goes on
			p.skip(true)
			if p.pos >= len(p.src) || p.atDefinition() {
				return seq, nil
			}
			if p.src[p.pos] == '|' {
				return seq, nil
			}
			continue
		}
		switch {
		case c == '|' || c == ')':
			return seq, nil
		case c == '"':
			p.pos++
			last = len(seq)
			for {
				if p.pos >= len(p.src) {
					return nil, p.errorf("unterminated string")
				}
				if p.src[p.pos] == '"' {
					p.pos++
					break
				}
				r, err := p.char()
				if err != nil {
					return nil, err
				}
				seq = append(seq, p.b.class([][2]rune{{r, r}}))
			}
			if last == len(seq) { // "": the empty string
				last = -1
			}
		case c == '[':
			p.pos++
			neg := false
			if p.pos < len(p.src) && p.src[p.pos] == '^' {
				neg = true
				p.pos++
			}
			var ranges [][2]rune
			for {
				if p.pos >= len(p.src) {
					return nil, p.errorf("unterminated character class")
				}
				if p.src[p.pos] == ']' {
					p.pos++
					break
				}
				lo, err := p.char()
				if err != nil {
					return nil, err
				}
				hi := lo
				if p.pos+1 < len(p.src) && p.src[p.pos] == '-' && p.src[p.pos+1] != ']' {
					p.pos++
					if hi, err = p.char(); err != nil {
						return nil, err
					}
					if hi < lo {
						return nil, p.errorf("range %q-%q is reversed", lo, hi)
					}
				}
				ranges = append(ranges, [2]rune{lo, hi})
			}
			if neg {
				ranges = complement(ranges)
			}
			last = len(seq)
			seq = append(seq, p.b.class(ranges))
		case c == '.':
			p.pos++
			last = len(seq)
			seq = append(seq, p.b.class([][2]rune{{0, maxRune}}))
		case c == '(':
			p.pos++
			p.skip(true)
			id := p.b.fresh(name)
			alts, err := p.alternates(name, true)
			if err != nil {
				return nil, err
			}
			p.skip(true)
			if p.pos >= len(p.src) || p.src[p.pos] != ')' {
				return nil, p.errorf("expected )")
			}
			p.pos++
			p.b.seqs[id] = alts
			last = len(seq)
			seq = append(seq, elem{kind: kRule, arg: id})
		case c == '*' || c == '+' || c == '?' || c == '{':
			if last < 0 {
				return nil, p.errorf("%q with nothing to repeat", c)
			}
			lo, hi, err := p.repetition()
			if err != nil {
				return nil, err
			}
			term := append([]elem(nil), seq[last:]...)
			seq = append(seq[:last], p.b.repeat(name, term, lo, hi)...)
			last = -1
		case isWordChar(c):
			ref := p.name()
			last = len(seq)
			seq = append(seq, elem{kind: kRule, arg: p.b.ruleID(ref)})
		default:
			return nil, p.errorf("unexpected %q", c)
		}
	}
}

// repetition parses *, +, ? or {m}, {m,}, {m,n}; hi < 0 is unbounded.
func (p *gbnfParser) repetition() (lo, hi int, err error) {
	c := p.src[p.pos]
	p.pos++
	switch c {
	case '*':
		return 0, -1, nil
	case '+':
		return 1, -1, nil
	case '?':
		return 0, 1, nil
	}
	end := strings.IndexByte(p.src[p.pos:], '}')
	if end < 0 {
		return 0, 0, p.errorf("unterminated {")
	}
	body := strings.ReplaceAll(p.src[p.pos:p.pos+end], " ", "")
	p.pos += end + 1
	num := func(s string) (int, error) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > maxRepeat {
			return 0, p.errorf("repetition count %q is not in [0, %d]", s, maxRepeat)
		}
		return n, nil
	}
	a, b, comma := strings.Cut(body, ",")
	if lo, err = num(a); err != nil {
		return 0, 0, err
	}
	switch {
	case !comma:
		return lo, lo, nil
	case b == "":
		return lo, -1, nil
	}
	if hi, err = num(b); err != nil {
		return 0, 0, err
	}
	if hi < lo {
		return 0, 0, p.errorf("repetition {%d,%d} is reversed", lo, hi)
	}
	return lo, hi, nil
}

// char reads one (possibly escaped) character of a literal or class.
func (p *gbnfParser) char() (rune, error) {
	if p.src[p.pos] != '\\' {
		r, n := utf8.DecodeRuneInString(p.src[p.pos:])
		if r == utf8.RuneError && n <= 1 {
			return 0, p.errorf("invalid UTF-8")
		}
		p.pos += n
		return r, nil
	}
	p.pos++
	if p.pos >= len(p.src) {
		return 0, p.errorf("escape at the end")
	}
	c := p.src[p.pos]
	p.pos++
	hex := func(n int) (rune, error) {
		if p.pos+n > len(p.src) {
			return 0, p.errorf("short \\%c escape", c)
		}
		v, err := strconv.ParseUint(p.src[p.pos:p.pos+n], 16, 32)
		if err != nil || v > maxRune {
			return 0, p.errorf("bad \\%c escape %q", c, p.src[p.pos:p.pos+n])
		}
		p.pos += n
		return rune(v), nil
	}
	switch c {
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'x':
		return hex(2)
	case 'u':
		return hex(4)
	case 'U':
		return hex(8)
	}
	r, n := utf8.DecodeRuneInString(p.src[p.pos-1:])
	p.pos += n - 1
	return r, nil
}

// repeat expands term{lo,hi} (hi < 0: unbounded) into elements and helper
// rules: the term lo times, then a right-recursive star or a chain of
// nested optionals.
func (b *builder) repeat(base string, term []elem, lo, hi int) []elem {
	item := term[0]
	if len(term) != 1 {
		id := b.fresh(base)
		b.seqs[id] = [][]elem{term}
		item = elem{kind: kRule, arg: id}
	}
	var out []elem
	for range lo {
		out = append(out, item)
	}
	switch {
	case hi < 0:
		star := b.fresh(base)
		b.seqs[star] = [][]elem{{item, {kind: kRule, arg: star}}, {}}
		out = append(out, elem{kind: kRule, arg: star})
	case hi > lo:
		prev := int32(-1)
		for range hi - lo {
			id := b.fresh(base)
			alt := []elem{item}
			if prev >= 0 {
				alt = append(alt, elem{kind: kRule, arg: prev})
			}
			b.seqs[id] = [][]elem{alt, {}}
			prev = id
		}
		out = append(out, elem{kind: kRule, arg: prev})
	}
	return out
}

// Quote returns s as a GBNF string literal.
func Quote(s string) string {
	var sb strings.Builder
	sb.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			sb.WriteByte('\\')
			sb.WriteRune(r)
		case r == '\n':
			sb.WriteString(`\n`)
		case r == '\r':
			sb.WriteString(`\r`)
		case r == '\t':
			sb.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&sb, `\x%02X`, r)
		default:
			sb.WriteRune(r)
		}
	}
	sb.WriteByte('"')
	return sb.String()
}
