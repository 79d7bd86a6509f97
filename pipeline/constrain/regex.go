package constrain

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// regexToGBNF turns a JSON Schema "pattern" (the ECMAScript subset real
// schemas use: literals, escapes, classes, ., groups, |, and the
// quantifiers * + ? {m} {m,} {m,n}) into a GBNF expression for the
// *encoded* JSON string content that matches it. The output is always one
// whole match: a pattern's search semantics accept any string containing
// a match, so a string that is exactly a match is valid whether or not the
// pattern is anchored. Characters JSON must escape are written escaped
// where the pattern names them literally and left out of classes.
// Lookaround, backreferences and word boundaries are refused
// (ErrUnsupported).
func regexToGBNF(pattern string) (string, error) {
	p := &reParser{src: pattern}
	out, err := p.alt()
	if err != nil {
		return "", err
	}
	if p.pos < len(p.src) {
		return "", p.errorf("unexpected %q", p.src[p.pos])
	}
	return out, nil
}

type reParser struct {
	src string
	pos int
}

func (p *reParser) errorf(format string, a ...any) error {
	return fmt.Errorf("constrain: pattern %q at %d: %s: %w", p.src, p.pos, fmt.Sprintf(format, a...), ErrUnsupported)
}

func (p *reParser) alt() (string, error) {
	var alts []string
	for {
		s, err := p.seq()
		if err != nil {
			return "", err
		}
		alts = append(alts, s)
		if p.pos < len(p.src) && p.src[p.pos] == '|' {
			p.pos++
			continue
		}
		break
	}
	if len(alts) == 1 {
		return alts[0], nil
	}
	return "(" + strings.Join(alts, " | ") + ")", nil
}

func (p *reParser) seq() (string, error) {
	var parts []string
	for p.pos < len(p.src) {
		c := p.src[p.pos]
		if c == '|' || c == ')' {
			break
		}
		if c == '^' || c == '$' {
			p.pos++
			continue
		}
		atom, err := p.atom()
		if err != nil {
			return "", err
		}
		q, err := p.quantifier()
		if err != nil {
			return "", err
		}
		parts = append(parts, "("+atom+")"+q)
	}
	if len(parts) == 0 {
		return `""`, nil
	}
	return strings.Join(parts, " "), nil
}

func (p *reParser) quantifier() (string, error) {
	if p.pos >= len(p.src) {
		return "", nil
	}
	var q string
	switch c := p.src[p.pos]; c {
	case '*', '+', '?':
		p.pos++
		q = string(c)
	case '{':
		end := strings.IndexByte(p.src[p.pos:], '}')
		if end < 0 {
			return "", p.errorf("unterminated {")
		}
		body := p.src[p.pos+1 : p.pos+end]
		a, b, comma := strings.Cut(body, ",")
		lo, err := strconv.Atoi(a)
		if err != nil || lo < 0 || lo > maxRepeat {
			return "", p.errorf("bad repetition {%s}", body)
		}
		switch {
		case !comma:
			q = fmt.Sprintf("{%d}", lo)
		case b == "":
			q = fmt.Sprintf("{%d,}", lo)
		default:
			hi, err := strconv.Atoi(b)
			if err != nil || hi < lo || hi > maxRepeat {
				return "", p.errorf("bad repetition {%s}", body)
			}
			q = fmt.Sprintf("{%d,%d}", lo, hi)
		}
		p.pos += end + 1
	default:
		return "", nil
	}
	if p.pos < len(p.src) && (p.src[p.pos] == '?' || p.src[p.pos] == '+') { // lazy or possessive: the same language
		p.pos++
	}
	return q, nil
}

// forbidden are the characters a JSON string cannot hold unescaped.
var forbidden = [][2]rune{{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}

func subtract(rs, minus [][2]rune) [][2]rune {
	var out [][2]rune
	for _, r := range newClass(rs).ranges {
		cur := [][2]rune{r}
		for _, m := range minus {
			var next [][2]rune
			for _, c := range cur {
				if m[1] < c[0] || m[0] > c[1] {
					next = append(next, c)
					continue
				}
				if c[0] < m[0] {
					next = append(next, [2]rune{c[0], m[0] - 1})
				}
				if c[1] > m[1] {
					next = append(next, [2]rune{m[1] + 1, c[1]})
				}
			}
			cur = next
		}
		out = append(out, cur...)
	}
	return out
}

// classGBNF writes ranges as a GBNF class (after removing what JSON must
// escape).
func (p *reParser) classGBNF(rs [][2]rune) (string, error) {
	rs = subtract(rs, forbidden)
	if len(rs) == 0 {
		return "", p.errorf("a class with no character a JSON string holds unescaped")
	}
	var sb strings.Builder
	sb.WriteByte('[')
	for _, r := range rs {
		sb.WriteString(gbnfClassChar(r[0]))
		if r[1] > r[0] {
			sb.WriteByte('-')
			sb.WriteString(gbnfClassChar(r[1]))
		}
	}
	sb.WriteByte(']')
	return sb.String(), nil
}

func gbnfClassChar(r rune) string {
	switch {
	case r < 0x20 || r == '\\' || r == ']' || r == '[' || r == '-' || r == '^' || r == '"' || r == 0x7f:
		return fmt.Sprintf(`\x%02X`, r)
	case r > 0xFFFF:
		return fmt.Sprintf(`\U%08X`, r)
	}
	return string(r)
}

// literal is the GBNF for one pattern character, escaped as JSON needs.
func literal(r rune) string {
	switch r {
	case '"':
		return `"\\\""`
	case '\\':
		return `"\\\\"`
	case '\n':
		return `"\\n"`
	case '\r':
		return `"\\r"`
	case '\t':
		return `"\\t"`
	}
	if r < 0x20 {
		return fmt.Sprintf(`"\\u%04x"`, r)
	}
	return Quote(string(r))
}

var (
	digitRanges = [][2]rune{{'0', '9'}}
	wordRanges  = [][2]rune{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}
	spaceRanges = [][2]rune{{'\t', '\r'}, {' ', ' '}} // ASCII, as Go's regexp (validators) reads \s
)

func (p *reParser) atom() (string, error) {
	c := p.src[p.pos]
	switch c {
	case '(':
		p.pos++
		if strings.HasPrefix(p.src[p.pos:], "?:") {
			p.pos += 2
		} else if strings.HasPrefix(p.src[p.pos:], "?<") && !strings.HasPrefix(p.src[p.pos:], "?<=") && !strings.HasPrefix(p.src[p.pos:], "?<!") {
			end := strings.IndexByte(p.src[p.pos:], '>')
			if end < 0 {
				return "", p.errorf("unterminated group name")
			}
			p.pos += end + 1
		} else if p.pos < len(p.src) && p.src[p.pos] == '?' {
			return "", p.errorf("lookaround")
		}
		s, err := p.alt()
		if err != nil {
			return "", err
		}
		if p.pos >= len(p.src) || p.src[p.pos] != ')' {
			return "", p.errorf("expected )")
		}
		p.pos++
		return s, nil
	case '[':
		p.pos++
		rs, err := p.class()
		if err != nil {
			return "", err
		}
		return p.classGBNF(rs)
	case '.':
		p.pos++
		return p.classGBNF(complement([][2]rune{{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}))
	case '\\':
		rs, lit, err := p.escape(false)
		if err != nil {
			return "", err
		}
		if rs != nil {
			return p.classGBNF(rs)
		}
		return literal(lit), nil
	case '*', '+', '?', '{':
		return "", p.errorf("%q with nothing to repeat", c)
	}
	r, n := utf8.DecodeRuneInString(p.src[p.pos:])
	p.pos += n
	return literal(r), nil
}

// escape reads \x after the backslash: a class (\d, \w, \s and their
// negations) or a single character.
func (p *reParser) escape(inClass bool) ([][2]rune, rune, error) {
	p.pos++ // the backslash
	if p.pos >= len(p.src) {
		return nil, 0, p.errorf("escape at the end")
	}
	c := p.src[p.pos]
	p.pos++
	hex := func(n int) (rune, error) {
		if p.pos+n > len(p.src) {
			return 0, p.errorf("short escape")
		}
		v, err := strconv.ParseUint(p.src[p.pos:p.pos+n], 16, 32)
		if err != nil {
			return 0, p.errorf("bad escape")
		}
		p.pos += n
		return rune(v), nil
	}
	switch c {
	case 'd':
		return digitRanges, 0, nil
	case 'D':
		return complement(digitRanges), 0, nil
	case 'w':
		return wordRanges, 0, nil
	case 'W':
		return complement(wordRanges), 0, nil
	case 's':
		return spaceRanges, 0, nil
	case 'S':
		return complement(spaceRanges), 0, nil
	case 'n':
		return nil, '\n', nil
	case 'r':
		return nil, '\r', nil
	case 't':
		return nil, '\t', nil
	case 'f':
		return nil, '\f', nil
	case 'v':
		return nil, '\v', nil
	case '0':
		return nil, 0, nil
	case 'x':
		r, err := hex(2)
		return nil, r, err
	case 'u':
		r, err := hex(4)
		return nil, r, err
	case 'b':
		if inClass {
			return nil, '\b', nil
		}
		return nil, 0, p.errorf("word boundary")
	case 'B':
		return nil, 0, p.errorf("word boundary")
	}
	if c >= '1' && c <= '9' {
		return nil, 0, p.errorf("backreference")
	}
	r, n := utf8.DecodeRuneInString(p.src[p.pos-1:])
	p.pos += n - 1
	return nil, r, nil
}

// class reads a [...] class after the [.
func (p *reParser) class() ([][2]rune, error) {
	neg := false
	if p.pos < len(p.src) && p.src[p.pos] == '^' {
		neg = true
		p.pos++
	}
	var rs [][2]rune
	first := true
	for {
		if p.pos >= len(p.src) {
			return nil, p.errorf("unterminated class")
		}
		c := p.src[p.pos]
		if c == ']' && !first {
			p.pos++
			break
		}
		first = false
		item := func() ([][2]rune, rune, error) {
			if p.src[p.pos] == '\\' {
				return p.escape(true)
			}
			r, n := utf8.DecodeRuneInString(p.src[p.pos:])
			p.pos += n
			return nil, r, nil
		}
		set, lo, err := item()
		if err != nil {
			return nil, err
		}
		if set != nil {
			rs = append(rs, set...)
			continue
		}
		hi := lo
		if p.pos+1 < len(p.src) && p.src[p.pos] == '-' && p.src[p.pos+1] != ']' {
			p.pos++
			set, h, err := item()
			if err != nil {
				return nil, err
			}
			if set != nil || h < lo {
				return nil, p.errorf("bad range")
			}
			hi = h
		}
		rs = append(rs, [2]rune{lo, hi})
	}
	if neg {
		rs = complement(rs)
	}
	return rs, nil
}
