package constrain

import (
	"errors"
	"math/rand/v2"
	"testing"
)

// validPrefix reports whether s can be continued to a sentence of g, by
// running the automaton from scratch.
func validPrefix(g *Grammar, s []byte) (ok, complete bool) {
	e := newEngine(g)
	st := e.start()
	for _, b := range s {
		if st = e.next(st, b); st < 0 {
			return false, false
		}
	}
	return true, e.states[st].complete
}

func bit(mask []uint64, id int32) bool { return mask[id>>6]&(1<<(id&63)) != 0 }

// TestMaskMatchesBruteForce: at every step of random walks, the mask
// holds exactly the tokens whose bytes extend the output to a valid prefix
// (checked token by token from scratch), and EOG exactly when complete.
func TestMaskMatchesBruteForce(t *testing.T) {
	v := testVocab()
	for _, src := range []string{arithmetic, list, jsonGBNF, `root ::= "héllo" | [α-ω]+ | "😀" .`} {
		g, err := ParseGBNF(src)
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(7, 8))
		for range 5 {
			m := g.NewMatcher(v, -1)
			var out []byte
			for step := 0; step < 40; step++ {
				mask, err := m.Allowed()
				if err != nil {
					t.Fatal(err)
				}
				var allowed []int32
				for id := int32(0); id < int32(v.Size()); id++ {
					want := false
					if id == 0 {
						_, want = validPrefix(g, out)
					} else if p, ok := v.piece(id); ok {
						want, _ = validPrefix(g, append(append([]byte(nil), out...), p...))
					}
					if got := bit(mask, id); got != want {
						t.Fatalf("%q after %q: token %d (%q): mask %v, brute force %v", src, out, id, v.pieces[id], got, want)
					}
					if want {
						allowed = append(allowed, id)
					}
				}
				id := allowed[rng.IntN(len(allowed))]
				if err := m.Accept(id); err != nil {
					t.Fatal(err)
				}
				if id == 0 {
					break
				}
				out = append(out, v.pieces[id]...)
			}
			m.Close()
		}
	}
}

// TestUTF8: characters split across tokens, tokens that end inside a
// character, and byte sequences that are never valid UTF-8.
func TestUTF8(t *testing.T) {
	g, err := ParseGBNF(`root ::= "é" [😀-😂] "x"`)
	if err != nil {
		t.Fatal(err)
	}
	pieces := [][]byte{nil, {0xC3}, {0xA9}, {0xC3, 0xA9}, {0xF0, 0x9F}, {0x98, 0x80}, {0x98, 0x83}, []byte("x"), {0xA9, 0xF0}, {0xC0, 0x80}, {0xFF}, []byte("😀x"), {0xED, 0xA0, 0x80}}
	v := NewVocab(pieces, []int32{0})
	allowedIDs := func(m *Matcher) []int32 {
		mask, err := m.Allowed()
		if err != nil {
			t.Fatal(err)
		}
		var ids []int32
		for id := int32(0); id < int32(len(pieces)); id++ {
			if bit(mask, id) {
				ids = append(ids, id)
			}
		}
		return ids
	}
	m := g.NewMatcher(v, -1)
	defer m.Close()
	if got := allowedIDs(m); !equalIDs(got, []int32{1, 3}) { // C3 alone or é whole
		t.Fatalf("start: %v, want [1 3]", got)
	}
	for _, id := range []int32{1, 8} { // C3, then A9 F0: é and the start of an emoji
		if err := m.Accept(id); err != nil {
			t.Fatal(err)
		}
	}
	// F0 9F 98 80..82 are 😀..😂; 98 83 would be 😃 (out of the class).
	// After F0 only 9F can follow, and no piece starts with 9F.
	if got := allowedIDs(m); len(got) != 0 {
		t.Fatalf("after C3, A9 F0: %v, want none", got)
	}
	m2 := g.NewMatcher(v, -1)
	defer m2.Close()
	for _, id := range []int32{3, 4} {
		if err := m2.Accept(id); err != nil {
			t.Fatal(err)
		}
	}
	if got := allowedIDs(m2); !equalIDs(got, []int32{5}) { // 98 80 yes, 98 83 no
		t.Fatalf("after é F0 9F: %v, want [5]", got)
	}
	if err := m2.Accept(6); !errors.Is(err, ErrRejected) {
		t.Fatalf("😃: %v, want ErrRejected", err)
	}
	if err := m2.Accept(5); err != nil {
		t.Fatal(err)
	}
	if m2.Complete() {
		t.Fatal("complete before the x")
	}
	if err := m2.Accept(0); !errors.Is(err, ErrRejected) {
		t.Fatalf("EOG before complete: %v, want ErrRejected", err)
	}
	if err := m2.Accept(7); err != nil {
		t.Fatal(err)
	}
	if got := allowedIDs(m2); !equalIDs(got, []int32{0}) {
		t.Fatalf("complete: %v, want only EOG", got)
	}
	// Overlong, surrogate and invalid bytes are never valid prefixes.
	any, err := ParseGBNF(`root ::= .*`)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range [][]byte{{0xC0, 0x80}, {0xFF}, {0xED, 0xA0, 0x80}, {0x80}, {0xF4, 0x90, 0x80, 0x80}, {0xE0, 0x80}} {
		if ok, _ := validPrefix(any, s); ok {
			t.Errorf("% x accepted as UTF-8", s)
		}
	}
	for _, s := range [][]byte{{0xE2}, {0xE2, 0x82}, {0xF0, 0x9F, 0x98}} {
		if ok, complete := validPrefix(any, s); !ok || complete {
			t.Errorf("% x: prefix %v complete %v, want a pending character", s, ok, complete)
		}
	}
}

func equalIDs(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestBudget: whatever the walk picks, a sequence given n tokens ends with
// a complete sentence and an EOG within them.
func TestBudget(t *testing.T) {
	g, err := ParseGBNF(`root ::= "[" ( "ab"+ ( "," "ab"+ )* )? "]"`)
	if err != nil {
		t.Fatal(err)
	}
	v := testVocab()
	rng := rand.New(rand.NewPCG(1, 2))
	for budget := 3; budget < 40; budget++ {
		out := walk(t, g, v, rng, budget)
		if !g.Accepts(out) {
			t.Fatalf("budget %d: %q", budget, out)
		}
	}
	// Too small a budget: the walk still heads for completion.
	m := g.NewMatcher(v, 1)
	defer m.Close()
	mask, err := m.Allowed()
	if err != nil {
		t.Fatal(err)
	}
	if !bit(mask, int32(1+'[')) {
		t.Error("budget 1: '[' (towards completion) not allowed")
	}
}

func TestJSONObjectGrammar(t *testing.T) {
	g := JSONObject()
	for _, s := range []string{`{}`, `{"a":1}`, `{"a":[true,null,-1.5e3,"x"],"b":{"c":{}}}`} {
		if !g.Accepts(s) {
			t.Errorf("rejects %s", s)
		}
	}
	for _, s := range []string{`[]`, `"x"`, `{"a":}`, `{a:1}`, `{"a":01}`} {
		if g.Accepts(s) {
			t.Errorf("accepts %s", s)
		}
	}
	if JSONObject() != g {
		t.Error("JSONObject compiled twice: its masks are not shared")
	}
}

// TestLazyGrammar: free text until the trigger (which may span tokens),
// the grammar from the trigger's first byte on.
func TestLazyGrammar(t *testing.T) {
	g, err := ParseGBNF(`root ::= "<call>" [0-9]+ "</call>"`)
	if err != nil {
		t.Fatal(err)
	}
	lazy := g.WithTriggers("<call>")
	pieces := [][]byte{nil, []byte("hello "), []byte("<ca"), []byte("ll>1"), []byte("2"), []byte("</call>"), []byte("x"), []byte("<call>")}
	v := NewVocab(pieces, []int32{0})
	m := lazy.NewMatcher(v, -1)
	defer m.Close()
	mask, err := m.Allowed()
	if err != nil {
		t.Fatal(err)
	}
	for id := range int32(len(pieces)) {
		if !bit(mask, id) {
			t.Fatalf("before the trigger token %d is not allowed", id)
		}
	}
	for _, id := range []int32{1, 6, 2, 3} { // "hello x<ca" "ll>1": the trigger across two tokens
		if err := m.Accept(id); err != nil {
			t.Fatalf("token %d: %v", id, err)
		}
	}
	mask, _ = m.Allowed()
	for id, want := range []bool{false, false, false, false, true, true, false, false} {
		if bit(mask, int32(id)) != want {
			t.Fatalf("after the trigger: token %d (%q) allowed %v, want %v", id, pieces[id], !want, want)
		}
	}
	if err := m.Accept(5); err != nil {
		t.Fatal(err)
	}
	mask, _ = m.Allowed()
	if !bit(mask, 0) || bit(mask, 4) {
		t.Fatal("after </call>: want only the end")
	}
	// Ending before any trigger is fine; the plain grammar is unchanged.
	m2 := lazy.NewMatcher(v, -1)
	defer m2.Close()
	if err := m2.Accept(1); err != nil {
		t.Fatal(err)
	}
	if err := m2.Accept(0); err != nil {
		t.Fatalf("EOG before a trigger: %v", err)
	}
	m3 := g.NewMatcher(v, -1)
	defer m3.Close()
	if err := m3.Accept(1); !errors.Is(err, ErrRejected) {
		t.Fatalf("the eager grammar took free text: %v", err)
	}
}

// TestBudgetMasks: masks under a binding budget, built from a cached
// state's distance lists, equal a fresh walk of the vocabulary with that
// budget, at every step of random walks and for every budget that binds.
func TestBudgetMasks(t *testing.T) {
	v := testVocab()
	schema, err := JSONSchema([]byte(`{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"array","items":{"type":"integer"},"maxItems":3},"c":{"enum":["x","yy"]}},"required":["a","c"]}`))
	if err != nil {
		t.Fatal(err)
	}
	gbnf, err := ParseGBNF(jsonGBNF)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []*Grammar{schema, gbnf} {
		rng := rand.New(rand.NewPCG(3, 4))
		m := g.NewMatcher(v, -1)
		var out []byte
		for step := 0; step < 60; step++ {
			ent := func() *maskEntry { // the cached entry of the current state
				m.wait()
				m.budget, m.valid = -1, false
				if _, err := m.Allowed(); err != nil {
					t.Fatal(err)
				}
				return m.e.masks[m.state]
			}()
			fresh := newEngine(g)
			s := fresh.start()
			for _, b := range out {
				s = fresh.next(s, b)
			}
			want := make([]uint64, len(m.own))
			stk := make([]int32, v.depth+1)
			for budget := 1; budget <= int(ent.maxDist)+2; budget++ {
				m.budget, m.valid = budget, false
				got, err := m.Allowed()
				if err != nil {
					t.Fatal(err)
				}
				fresh.computeMask(v, s, budget, want, stk, nil, nil)
				for w := range want {
					if got[w] != want[w] {
						t.Fatalf("after %q, budget %d: word %d: %064b, a fresh walk gives %064b", out, budget, w, got[w], want[w])
					}
				}
			}
			m.budget, m.valid = -1, false
			mask, _ := m.Allowed()
			var ids []int32
			for id := int32(0); id < int32(v.Size()); id++ {
				if bit(mask, id) {
					ids = append(ids, id)
				}
			}
			id := ids[rng.IntN(len(ids))]
			if err := m.Accept(id); err != nil {
				t.Fatal(err)
			}
			if id == 0 {
				break
			}
			out = append(out, v.pieces[id]...)
		}
		m.Close()
	}
}

// TestStateBounds: a transition to more parse stacks than the bound is
// refused: the sequence fails instead of the automaton growing without
// limit.
func TestStateBounds(t *testing.T) {
	g, err := ParseGBNF(`root ::= "x" ( "a" "b" | "a" "c" | "a" "d" )`)
	if err != nil {
		t.Fatal(err)
	}
	if !g.Accepts("xab") {
		t.Fatal("rejects xab")
	}
	defer func(n int) { maxStacks = n }(maxStacks)
	maxStacks = 2
	if g.Accepts("xab") {
		t.Fatal("a state of 3 stacks was allowed past a bound of 2")
	}
	v := testVocab()
	m := g.NewMatcher(v, -1)
	defer m.Close()
	mask, err := m.Allowed()
	if err != nil {
		t.Fatal(err)
	}
	if bit(mask, int32(1+'x')) {
		t.Fatal("x allowed though it leads past the bound")
	}
}
