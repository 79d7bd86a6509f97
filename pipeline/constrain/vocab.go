package constrain

import (
	"bytes"
	"slices"
	"sync"
	"sync/atomic"
)

// Vocab is a model's vocabulary as the matcher sees it: each token's bytes
// (what it adds to the output) in a byte trie, and the end-of-generation
// tokens. Build it once per model; it is read-only and safe for concurrent
// use.
type Vocab struct {
	n      int
	eog    []int32
	pieces [][]byte
	all    []uint64   // every token with text, and the end of generation: a lazy grammar's mask
	nodes  []trieNode // preorder; a node's depth is 1 + its parent's
	toks   []int32    // tokens ending at a node: toks[nodes[i].tok0:nodes[i].tok1]
	depth  int
}

type trieNode struct {
	b          byte
	depth      uint16
	skip       int32 // the first node after this one's subtree
	tok0, tok1 int32
}

// maxTokenBytes bounds a token's length (the trie's depth).
const maxTokenBytes = 1 << 12

// NewVocab builds the trie of pieces[id], the bytes each token adds to the
// output. A nil or empty piece (control tokens, unused ids) is never
// allowed; the eog tokens are allowed exactly when the output is complete.
func NewVocab(pieces [][]byte, eog []int32) *Vocab {
	v := &Vocab{n: len(pieces), pieces: make([][]byte, len(pieces))}
	for id, p := range pieces {
		v.pieces[id] = slices.Clone(p)
	}
	for _, id := range eog {
		if id >= 0 && int(id) < len(pieces) {
			v.eog = append(v.eog, id)
		}
	}
	ids := make([]int32, 0, len(pieces))
	for id, p := range pieces {
		if len(p) > 0 && len(p) <= maxTokenBytes && !slices.Contains(v.eog, int32(id)) {
			ids = append(ids, int32(id))
		}
	}
	slices.SortFunc(ids, func(a, b int32) int {
		if c := bytes.Compare(pieces[a], pieces[b]); c != 0 {
			return c
		}
		return int(a - b)
	})
	var path []int32 // node index per depth-1 of the current path
	var prev []byte
	for _, id := range ids {
		p := pieces[id]
		common := 0
		for common < len(prev) && common < len(p) && prev[common] == p[common] {
			common++
		}
		if common == len(p) && len(p) == len(prev) { // the same bytes as the previous token
			v.toks = append(v.toks, id)
			v.nodes[path[len(p)-1]].tok1++
			continue
		}
		// Close the subtrees the new piece leaves.
		for d := len(path) - 1; d >= common; d-- {
			v.nodes[path[d]].skip = int32(len(v.nodes))
		}
		path = path[:common]
		for d := common; d < len(p); d++ {
			path = append(path, int32(len(v.nodes)))
			t := int32(len(v.toks))
			v.nodes = append(v.nodes, trieNode{b: p[d], depth: uint16(d + 1), tok0: t, tok1: t})
		}
		v.toks = append(v.toks, id)
		v.nodes[len(v.nodes)-1].tok1++
		v.depth = max(v.depth, len(p))
		prev = p
	}
	for _, n := range path {
		v.nodes[n].skip = int32(len(v.nodes))
	}
	v.all = make([]uint64, (v.n+63)/64)
	for _, id := range append(slices.Clone(v.toks), v.eog...) {
		v.all[id>>6] |= 1 << (id & 63)
	}
	return v
}

// Size is the number of token ids.
func (v *Vocab) Size() int { return v.n }

// maskEntry is the cached mask of one grammar state: the allowed tokens
// with an unlimited budget, and the largest completion distance among
// them (a budget at least that large allows the same tokens).
type maskEntry struct {
	mask    []uint64
	maxDist int32
	// For a budget that binds, the allowed tokens by distance, relative to
	// the state's own distance dist: progress those that end closer,
	// excess those that end farther (the rest end as far). Budget-bound
	// masks are built from them without walking the vocabulary; lists
	// false when there were too many to keep.
	dist     int32
	lists    bool
	progress []int32
	excess   []tokenDist
}

type tokenDist struct {
	id   int32
	dist int32
}

// maxListed bounds the progress and excess lists (a fraction of the
// vocabulary: past it, a budget-bound mask walks the trie again).
func maxListed(n int) int { return max(n/16, 256) }

// maskCache holds the masks of one grammar on one vocabulary, and the
// automata of finished sequences: a new sequence takes one already warm
// (its transitions and its states' masks found), so its steps are table
// lookups from the start. An automaton serves one sequence at a time.
type maskCache struct {
	mu      sync.Mutex
	m       map[string]*maskEntry
	engines []*engine
}

// Pooled automata: at most maxEngines kept, each of at most
// maxEngineStates states (a bigger one is dropped: it grew on a long or
// unusual sequence and would hold its memory for good).
const (
	maxEngines      = 64
	maxEngineStates = 1 << 16
	maxEngineMasks  = 1 << 10 // mask pointers an automaton keeps
)

func (c *maskCache) takeEngine(g *Grammar) *engine {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := len(c.engines); n > 0 {
		e := c.engines[n-1]
		c.engines = c.engines[:n-1]
		return e
	}
	return newEngine(g)
}

func (c *maskCache) putEngine(e *engine) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.engines) < maxEngines && len(e.states) <= maxEngineStates {
		c.engines = append(c.engines, e)
	}
}

// maxCacheBytes bounds a cache's masks (they are evicted at random past
// it: a grammar's hot states come back at once).
const maxCacheBytes = 16 << 20

func (c *maskCache) get(k []byte) *maskEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[string(k)]
}

func (c *maskCache) put(k []byte, e *maskEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if (len(c.m)+1)*len(e.mask)*8 > maxCacheBytes {
		n := len(c.m) / 2
		for k := range c.m {
			if n == 0 {
				break
			}
			delete(c.m, k)
			n--
		}
	}
	c.m[string(k)] = e
}

// cacheSet maps vocabularies to a grammar's mask caches.
type cacheSet struct {
	mu sync.Mutex
	m  map[*Vocab]*maskCache
}

func (s *cacheSet) of(v *Vocab) *maskCache {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[*Vocab]*maskCache{}
	}
	c := s.m[v]
	if c == nil {
		c = &maskCache{m: map[string]*maskEntry{}}
		s.m[v] = c
	}
	return c
}

// computeMask walks the trie from state s: a token is allowed when every
// byte of it is accepted and the output can then be completed within
// budget-2 more bytes (budget < 0: unlimited). It returns the largest such
// distance too.
// With ent, it also fills ent's distance lists (an unlimited walk).
func (e *engine) computeMask(v *Vocab, s int32, budget int, mask []uint64, stk []int32, stop *atomic.Bool, ent *maskEntry) (int32, bool) {
	stats.walks.Add(1)
	clear(mask)
	limit := int32(infLen - 1) // a state that can never complete is a dead end
	if budget >= 0 {
		// Past hope of completing in time, still allow the tokens that
		// get closer: the output ends as near complete as it can.
		// One token is kept for the end of generation, so that a complete
		// output ends as such (OpenAI's finish_reason "stop") rather than
		// at the token limit.
		limit = max(int32(min(budget-2, infLen-1)), e.states[s].dist-1)
	}
	maxDist := int32(0)
	here := e.states[s].dist
	if ent != nil {
		ent.dist, ent.lists = here, true
	}
	stk[0] = s
	nodes := v.nodes
	for i, polled := 0, 0; i < len(nodes); {
		if polled++; polled&4095 == 0 && stop != nil && stop.Load() {
			return 0, false
		}
		nd := &nodes[i]
		from := stk[nd.depth-1]
		t := int32(transUnknown)
		if tr := e.trans[from]; tr != nil { // the warm path, inlined
			t = tr[nd.b]
		}
		if t == transUnknown {
			t = e.next(from, nd.b)
		}
		if t < 0 {
			i = int(nd.skip)
			continue
		}
		stk[nd.depth] = t
		if nd.tok1 > nd.tok0 {
			if d := e.states[t].dist; d <= limit {
				maxDist = max(maxDist, d)
				for _, id := range v.toks[nd.tok0:nd.tok1] {
					mask[id>>6] |= 1 << (id & 63)
					if ent != nil && ent.lists && d != here {
						if d < here {
							ent.progress = append(ent.progress, id)
						} else {
							ent.excess = append(ent.excess, tokenDist{id, d})
						}
						if len(ent.progress)+len(ent.excess) > maxListed(v.n) {
							ent.lists, ent.progress, ent.excess = false, nil, nil
						}
					}
				}
			}
		}
		i++
	}
	if e.states[s].complete {
		for _, id := range v.eog {
			mask[id>>6] |= 1 << (id & 63)
		}
	}
	return maxDist, true
}

// budgetMask writes into dst the tokens of ent allowed with limit (the
// same rule as computeMask's), from its lists; false when it has none.
func (ent *maskEntry) budgetMask(dst []uint64, limit int32, complete bool, eog []int32) bool {
	if !ent.lists {
		return false
	}
	if limit < ent.dist {
		clear(dst)
		for _, id := range ent.progress {
			dst[id>>6] |= 1 << (id & 63)
		}
		if complete {
			for _, id := range eog {
				dst[id>>6] |= 1 << (id & 63)
			}
		}
		return true
	}
	copy(dst, ent.mask)
	for _, t := range ent.excess {
		if t.dist > limit {
			dst[t.id>>6] &^= 1 << (t.id & 63)
		}
	}
	return true
}
