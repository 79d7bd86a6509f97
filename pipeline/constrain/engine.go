package constrain

import (
	"encoding/binary"
	"slices"
)

// The automaton of one sequence. A grammar stack is a persistent list of
// positions (the top one at a character class, the ones below it the
// places to return to), interned so that a stack is one int32; a state is
// an interned set of stacks plus a pending partial UTF-8 character. Byte
// transitions between states are computed on first use and then read from
// a table, so walking the vocabulary trie costs one array load per trie
// node once the automaton is warm.

type stackNode struct {
	pos, next int32
	dist      int32 // fewest bytes to empty this stack
}

type state struct {
	set      int32
	cp       rune // partial character: the bits read so far
	need     int8 // continuation bytes still expected (0: none)
	length   int8 // the partial character's total length
	complete bool // the empty stack is in the set and no character is pending
	dist     int32
}

type stateKey struct {
	set          int32
	cp           rune
	need, length int8
}

const (
	transUnknown = -2
	transReject  = -1
)

type engine struct {
	g        *Grammar
	nodes    []stackNode
	nodeIdx  map[[2]int32]int32
	memo     map[[2]int32][]int32
	sets     [][]int32
	setIdx   map[string]int32
	states   []state
	stateIdx map[stateKey]int32
	trans    []*[256]int32
	masks    map[int32]*maskEntry // masks of states met so far (from the shared cache)
	buf      []byte
}

func newEngine(g *Grammar) *engine {
	e := &engine{g: g, nodeIdx: map[[2]int32]int32{}, memo: map[[2]int32][]int32{},
		setIdx: map[string]int32{}, stateIdx: map[stateKey]int32{}, masks: map[int32]*maskEntry{}}
	e.nodes = append(e.nodes, stackNode{}) // 0: the empty stack
	return e
}

// start is the state before any byte.
func (e *engine) start() int32 {
	var out []int32
	for _, a := range e.g.rules[e.g.root].alts {
		out = e.expandInto(a, 0, out)
	}
	return e.stateOf(out, 0, 0, 0)
}

func (e *engine) node(pos, next int32) int32 {
	k := [2]int32{pos, next}
	if id, ok := e.nodeIdx[k]; ok {
		return id
	}
	id := int32(len(e.nodes))
	e.nodes = append(e.nodes, stackNode{pos: pos, next: next, dist: min(infLen, e.g.minRest[pos]+e.nodes[next].dist)})
	e.nodeIdx[k] = id
	return id
}

// expand returns the stacks that continue from position pos with rest
// below it, each with a character class on top (or the empty stack).
func (e *engine) expand(pos, rest int32) []int32 {
	k := [2]int32{pos, rest}
	if v, ok := e.memo[k]; ok {
		return v
	}
	v := e.expandInto(pos, rest, nil)
	e.memo[k] = v
	return v
}

func (e *engine) expandInto(pos, rest int32, out []int32) []int32 {
	g := e.g
	switch el := g.elems[pos]; el.kind {
	case kChar:
		return append(out, e.node(pos, rest))
	case kEnd:
		if rest == 0 {
			return append(out, 0)
		}
		n := e.nodes[rest]
		return e.expandInto(n.pos, n.next, out)
	default: // kRule
		r := rest
		if g.elems[pos+1].kind != kEnd { // a tail call pushes no frame
			r = e.node(pos+1, rest)
		}
		for _, a := range g.rules[el.arg].alts {
			out = e.expandInto(a, r, out)
		}
		return out
	}
}

// stateOf interns the state of the stacks in out (which it may reorder).
func (e *engine) stateOf(out []int32, cp rune, need, length int8) int32 {
	slices.Sort(out)
	out = slices.Compact(out)
	e.buf = e.buf[:0]
	for _, s := range out {
		e.buf = binary.LittleEndian.AppendUint32(e.buf, uint32(s))
	}
	set, ok := e.setIdx[string(e.buf)]
	if !ok {
		set = int32(len(e.sets))
		e.sets = append(e.sets, slices.Clone(out))
		e.setIdx[string(e.buf)] = set
	}
	k := stateKey{set, cp, need, length}
	if id, ok := e.stateIdx[k]; ok {
		return id
	}
	st := state{set: set, cp: cp, need: need, length: length, dist: infLen}
	for _, s := range e.sets[set] {
		d := e.nodes[s].dist
		if need > 0 {
			n := e.nodes[s]
			d = int32(need) + e.g.minRest[n.pos+1] + e.nodes[n.next].dist
		}
		st.dist = min(st.dist, d)
		if s == 0 && need == 0 {
			st.complete = true
		}
	}
	id := int32(len(e.states))
	e.states = append(e.states, st)
	e.trans = append(e.trans, nil)
	e.stateIdx[k] = id
	return id
}

// next is the state after byte b, or transReject.
func (e *engine) next(s int32, b byte) int32 {
	t := e.trans[s]
	if t == nil {
		t = new([256]int32)
		for i := range t {
			t[i] = transUnknown
		}
		e.trans[s] = t
	}
	if v := t[b]; v != transUnknown {
		return v
	}
	v := e.step(s, b)
	e.trans[s][b] = v
	return v
}

var utf8Min = [5]rune{0, 0, 0x80, 0x800, 0x10000}

func (e *engine) step(s int32, b byte) int32 {
	st := e.states[s]
	if st.need == 0 {
		switch {
		case b < 0x80:
			return e.advance(st.set, rune(b))
		case b >= 0xC2 && b <= 0xDF:
			return e.partial(st.set, rune(b&0x1F), 1, 2)
		case b >= 0xE0 && b <= 0xEF:
			return e.partial(st.set, rune(b&0x0F), 2, 3)
		case b >= 0xF0 && b <= 0xF4:
			return e.partial(st.set, rune(b&0x07), 3, 4)
		}
		return transReject
	}
	if b&0xC0 != 0x80 {
		return transReject
	}
	cp := st.cp<<6 | rune(b&0x3F)
	if st.need > 1 {
		return e.partial(st.set, cp, st.need-1, st.length)
	}
	if cp < utf8Min[st.length] || cp > maxRune || cp >= 0xD800 && cp <= 0xDFFF {
		return transReject
	}
	return e.advance(st.set, cp)
}

// partial keeps the stacks whose class can still match a character that
// starts with the bits read so far.
func (e *engine) partial(set int32, cp rune, need, length int8) int32 {
	lo := cp << (6 * uint(need))
	hi := lo | (1<<(6*uint(need)) - 1)
	lo, hi = max(lo, utf8Min[length]), min(hi, maxRune)
	if lo > hi {
		return transReject
	}
	var out []int32
	for _, sid := range e.sets[set] {
		if sid == 0 {
			continue
		}
		c := &e.g.classes[e.g.elems[e.nodes[sid].pos].arg]
		// Surrogates never complete a character: look around them.
		if lo <= 0xD7FF && c.overlaps(lo, min(hi, 0xD7FF)) || hi >= 0xE000 && c.overlaps(max(lo, 0xE000), hi) {
			out = append(out, sid)
		}
	}
	if len(out) == 0 {
		return transReject
	}
	return e.stateOf(out, cp, need, length)
}

// Bounds on one automaton, against grammars whose parse states explode
// (very ambiguous ones): a transition to a state of more stacks than
// maxStacks, or made once the automaton holds maxNodes stack nodes, is
// rejected, so a sequence fails (no token allowed) rather than the
// process running out of memory.
var (
	maxStacks = 1 << 12
	maxNodes  = 1 << 22
)

// advance moves every stack whose class matches cp past it.
func (e *engine) advance(set int32, cp rune) int32 {
	var out []int32
	for _, sid := range e.sets[set] {
		if sid == 0 {
			continue
		}
		n := e.nodes[sid]
		if e.g.classes[e.g.elems[n.pos].arg].match(cp) {
			out = append(out, e.expand(n.pos+1, n.next)...)
		}
	}
	if len(out) == 0 || len(out) > maxStacks || len(e.nodes) > maxNodes {
		return transReject
	}
	return e.stateOf(out, 0, 0, 0)
}

// key is a description of state s that does not depend on this engine's
// numbering (the positions of every stack, stacks in a canonical order),
// for the mask cache shared between sequences.
func (e *engine) key(s int32, buf []byte) []byte {
	st := e.states[s]
	var stacks []string
	for _, sid := range e.sets[st.set] {
		var b []byte
		for n := sid; n != 0; n = e.nodes[n].next {
			b = binary.LittleEndian.AppendUint32(b, uint32(e.nodes[n].pos))
		}
		stacks = append(stacks, string(binary.LittleEndian.AppendUint32(b, 0xFFFFFFFF)))
	}
	slices.Sort(stacks)
	buf = binary.LittleEndian.AppendUint32(buf[:0], uint32(st.cp))
	buf = append(buf, byte(st.need), byte(st.length))
	for _, s := range stacks {
		buf = append(buf, s...)
	}
	return buf
}
