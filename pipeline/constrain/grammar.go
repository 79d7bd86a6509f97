// Package constrain restricts generation to a formal language: a grammar in
// llama.cpp's GBNF syntax, a JSON Schema (compiled to such a grammar), or
// any JSON object. A Grammar is compiled once and shared; a Matcher follows
// one sequence and gives, before each pick, the set of vocabulary tokens
// whose bytes keep the output a valid prefix of the language (end-of-
// generation tokens only once the output is complete).
//
// Matching is byte-level over the tokens' own bytes, so multi-byte tokens
// and tokens that split a UTF-8 character work alike: a pending partial
// character is part of the state. A mask is a walk of a byte trie of the
// vocabulary over a lazily built automaton (each state a set of grammar
// stacks; its byte transitions filled in on first use), pruned as soon as a
// prefix is rejected; masks are cached per grammar state and shared by every
// sequence of the same Grammar on the same Vocab, so after the first few
// steps a mask is mostly a cache hit. A Matcher computes the next mask in
// the background from the moment a token is accepted, so it overlaps the
// model's forward step.
//
// A Matcher also knows how many tokens the sequence may still generate: a
// token is allowed only if the output can still be completed within that
// budget (shortest completions are precomputed per grammar position), so a
// model that would ramble — random weights, say — still ends with complete
// output at the token limit rather than a truncated one.
//
// Entry points:
//
//   - JSONSchema(schema), JSONObject(), ParseGBNF(text): a *Grammar;
//   - NewConverter, AddSchema, Grammar(root): several schemas as rules of
//     one grammar whose root the caller writes (tool calls in a model's
//     own format), Quote for literals;
//   - (*Grammar).WithTriggers: a lazy grammar, free text until a trigger;
//   - NewVocab and (*Grammar).NewMatcher: a sequence's masks (package
//     pipeline does this for GenerateOptions.Grammar; package sample's
//     Constraint is what a Matcher is to the sampler);
//   - ReadStats: how much mask work there was and how much was waited for.
package constrain

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// ErrUnsupported is wrapped by schema and pattern errors for a feature the
// compiler does not enforce (rather than silently producing output that
// might not validate).
var ErrUnsupported = errors.New("constrain: unsupported")

type elemKind uint8

const (
	kEnd  elemKind = iota // end of an alternative
	kChar                 // one code point out of a class
	kRule                 // a reference to a rule
)

type elem struct {
	kind elemKind
	arg  int32 // kChar: class index; kRule: rule index
}

// class is a set of code points: sorted, merged, inclusive ranges, with the
// ASCII part also as a bitmap for the common case.
type class struct {
	ascii  [2]uint64
	ranges [][2]rune
}

func newClass(ranges [][2]rune) class {
	rs := slices.Clone(ranges)
	slices.SortFunc(rs, func(a, b [2]rune) int { return int(a[0] - b[0]) })
	var merged [][2]rune
	for _, r := range rs {
		if r[0] > r[1] {
			continue
		}
		if n := len(merged); n > 0 && r[0] <= merged[n-1][1]+1 {
			merged[n-1][1] = max(merged[n-1][1], r[1])
			continue
		}
		merged = append(merged, r)
	}
	c := class{ranges: merged}
	for _, r := range merged {
		for cp := r[0]; cp <= r[1] && cp < 128; cp++ {
			c.ascii[cp>>6] |= 1 << (cp & 63)
		}
	}
	return c
}

// complement is every code point not in ranges.
func complement(ranges [][2]rune) [][2]rune {
	c := newClass(ranges)
	var out [][2]rune
	next := rune(0)
	for _, r := range c.ranges {
		if r[0] > next {
			out = append(out, [2]rune{next, r[0] - 1})
		}
		next = r[1] + 1
	}
	if next <= maxRune {
		out = append(out, [2]rune{next, maxRune})
	}
	return out
}

const maxRune = 0x10FFFF

func (c *class) match(cp rune) bool {
	if cp < 128 {
		return c.ascii[cp>>6]&(1<<(cp&63)) != 0
	}
	i, _ := slices.BinarySearchFunc(c.ranges, cp, func(r [2]rune, cp rune) int {
		switch {
		case r[1] < cp:
			return -1
		case r[0] > cp:
			return 1
		}
		return 0
	})
	return i < len(c.ranges) && c.ranges[i][0] <= cp && cp <= c.ranges[i][1]
}

// overlaps reports whether some code point in [lo, hi] is in c.
func (c *class) overlaps(lo, hi rune) bool {
	for _, r := range c.ranges {
		if r[0] <= hi && lo <= r[1] {
			return true
		}
	}
	return false
}

// minLen is the UTF-8 length of the class's smallest code point.
func (c *class) minLen() int {
	if len(c.ranges) == 0 {
		return math.MaxInt32 / 4
	}
	cp := c.ranges[0][0]
	switch {
	case cp < 0x80:
		return 1
	case cp < 0x800:
		return 2
	case cp < 0x10000:
		return 3
	}
	return 4
}

type rule struct {
	name string
	alts []int32 // start positions in elems
}

// Grammar is a compiled grammar: rules of alternatives over code-point
// classes and rule references, checked for undefined rules and left
// recursion. It is immutable and safe for concurrent use; its mask caches
// (per Vocab) are shared by every Matcher made from it.
type Grammar struct {
	elems   []elem
	rules   []rule
	classes []class
	root    int32
	minRest []int32 // per position: fewest bytes that finish its alternative
	text    string  // the GBNF it was compiled from

	caches *cacheSet
	// triggers make the grammar lazy (WithTriggers).
	triggers []string
}

// WithTriggers returns the grammar made lazy: a sequence is free until its
// output contains one of the trigger strings, and from the trigger's first
// byte on it must follow the grammar (which therefore starts with the
// trigger), llama.cpp's lazy grammars. For tool calls a model may or may
// not make: g.WithTriggers("<tool_call>") lets it answer in prose or call
// a tool, and holds the call to the tools' schemas. The result shares g's
// mask caches.
func (g *Grammar) WithTriggers(triggers ...string) *Grammar {
	c := *g
	c.triggers = nil
	for _, t := range triggers {
		if t != "" {
			c.triggers = append(c.triggers, t)
		}
	}
	return &c
}

// GBNF returns the grammar's source in GBNF (for a JSON Schema, the grammar
// it was compiled to).
func (g *Grammar) GBNF() string { return g.text }

// builder assembles a Grammar.
type builder struct {
	g      Grammar
	byName map[string]int32
	seqs   [][][]elem // per rule: its alternatives while building
	used   map[string]string
	nextID map[string]int
}

func newBuilder() *builder {
	return &builder{g: Grammar{caches: &cacheSet{}}, byName: map[string]int32{}, nextID: map[string]int{}, used: map[string]string{}}
}

// ruleID returns the rule named name, declaring it on first use.
func (b *builder) ruleID(name string) int32 {
	if id, ok := b.byName[name]; ok {
		return id
	}
	id := int32(len(b.g.rules))
	b.g.rules = append(b.g.rules, rule{name: name})
	b.seqs = append(b.seqs, nil)
	b.byName[name] = id
	return id
}

// fresh declares a new synthetic rule named after base.
func (b *builder) fresh(base string) int32 {
	for {
		b.nextID[base]++
		name := fmt.Sprintf("%s-%d", base, b.nextID[base])
		if _, ok := b.byName[name]; !ok {
			return b.ruleID(name)
		}
	}
}

func (b *builder) class(ranges [][2]rune) elem {
	b.g.classes = append(b.g.classes, newClass(ranges))
	return elem{kind: kChar, arg: int32(len(b.g.classes) - 1)}
}

// finish lays the rules out, resolves the root and checks the grammar.
func (b *builder) finish(root string, defined map[string]bool) (*Grammar, error) {
	for name, id := range b.byName {
		if !defined[name] && len(b.seqs[id]) == 0 {
			return nil, fmt.Errorf("constrain: rule %q is used but not defined", name)
		}
	}
	rid, ok := b.byName[root]
	if !ok {
		return nil, fmt.Errorf("constrain: no %q rule", root)
	}
	g := &b.g
	g.root = rid
	for i, alts := range b.seqs {
		for _, seq := range alts {
			g.rules[i].alts = append(g.rules[i].alts, int32(len(g.elems)))
			g.elems = append(g.elems, seq...)
			g.elems = append(g.elems, elem{kind: kEnd})
		}
		if len(alts) == 0 { // a rule with no alternatives matches nothing: an empty class
			g.rules[i].alts = append(g.rules[i].alts, int32(len(g.elems)))
			g.classes = append(g.classes, newClass(nil))
			g.elems = append(g.elems, elem{kind: kChar, arg: int32(len(g.classes) - 1)}, elem{kind: kEnd})
		}
	}
	if err := g.checkLeftRecursion(); err != nil {
		return nil, err
	}
	g.computeMinLen()
	return g, nil
}

// nullable computes which rules can match the empty string.
func (g *Grammar) nullable() []bool {
	null := make([]bool, len(g.rules))
	for changed := true; changed; {
		changed = false
		for i, r := range g.rules {
			if null[i] {
				continue
			}
			for _, a := range r.alts {
				if g.seqNullable(a, null) {
					null[i], changed = true, true
					break
				}
			}
		}
	}
	return null
}

func (g *Grammar) seqNullable(pos int32, null []bool) bool {
	for ; ; pos++ {
		switch e := g.elems[pos]; e.kind {
		case kEnd:
			return true
		case kChar:
			return false
		case kRule:
			if !null[e.arg] {
				return false
			}
		}
	}
}

// checkLeftRecursion refuses a rule that can reach itself without
// consuming input: the matcher would expand it forever.
func (g *Grammar) checkLeftRecursion() error {
	null := g.nullable()
	// edges: rules reachable at the start of an alternative.
	edges := make([][]int32, len(g.rules))
	for i, r := range g.rules {
		for _, a := range r.alts {
			for pos := a; ; pos++ {
				e := g.elems[pos]
				if e.kind != kRule {
					break
				}
				edges[i] = append(edges[i], e.arg)
				if !null[e.arg] {
					break
				}
			}
		}
	}
	const (
		white = iota
		grey
		black
	)
	color := make([]int, len(g.rules))
	var visit func(int32) error
	visit = func(r int32) error {
		color[r] = grey
		for _, n := range edges[r] {
			switch color[n] {
			case grey:
				return fmt.Errorf("constrain: rule %q is left-recursive (reaches itself before any character)", g.rules[n].name)
			case white:
				if err := visit(n); err != nil {
					return err
				}
			}
		}
		color[r] = black
		return nil
	}
	for i := range g.rules {
		if color[i] == white {
			if err := visit(int32(i)); err != nil {
				return err
			}
		}
	}
	return nil
}

const infLen = math.MaxInt32 / 4

// computeMinLen fills minRest: the fewest bytes that complete the
// alternative from each position (a fixed point over the rules).
func (g *Grammar) computeMinLen() {
	ruleMin := make([]int32, len(g.rules))
	for i := range ruleMin {
		ruleMin[i] = infLen
	}
	seqMin := func(pos int32) int32 {
		n := int32(0)
		for ; ; pos++ {
			e := g.elems[pos]
			switch e.kind {
			case kEnd:
				return n
			case kChar:
				n += int32(g.classes[e.arg].minLen())
			case kRule:
				n += ruleMin[e.arg]
			}
			if n >= infLen {
				return infLen
			}
		}
	}
	for changed := true; changed; {
		changed = false
		for i, r := range g.rules {
			for _, a := range r.alts {
				if m := seqMin(a); m < ruleMin[i] {
					ruleMin[i], changed = m, true
				}
			}
		}
	}
	g.minRest = make([]int32, len(g.elems))
	for pos := len(g.elems) - 1; pos >= 0; pos-- {
		e := g.elems[pos]
		switch e.kind {
		case kEnd:
			g.minRest[pos] = 0
		case kChar:
			g.minRest[pos] = min(infLen, g.minRest[pos+1]+int32(g.classes[e.arg].minLen()))
		case kRule:
			g.minRest[pos] = min(infLen, g.minRest[pos+1]+ruleMin[e.arg])
		}
	}
}

// String lists the compiled rules (for debugging and tests).
func (g *Grammar) String() string {
	var sb strings.Builder
	for _, r := range g.rules {
		fmt.Fprintf(&sb, "%s ::=", r.name)
		for i, a := range r.alts {
			if i > 0 {
				sb.WriteString(" |")
			}
			for pos := a; g.elems[pos].kind != kEnd; pos++ {
				e := g.elems[pos]
				if e.kind == kRule {
					fmt.Fprintf(&sb, " %s", g.rules[e.arg].name)
				} else {
					fmt.Fprintf(&sb, " %v", g.classes[e.arg].ranges)
				}
			}
		}
		sb.WriteByte('\n')
	}
	return sb.String()
}
