// Package batch is the serving engine's continuous batching for one model:
// a scheduler goroutine owns the step loop (every running sequence's next
// token plus a budget of prompt tokens per step, one batched forward,
// sampling per sequence), and a block manager hands out the fixed-size
// blocks of one paged KV pool, sharing full prompt blocks between
// sequences with a common prefix and keeping them after their request
// ends until the pool needs them.
package batch

import (
	"encoding/binary"
	"hash/fnv"
	"slices"
)

// blocks manages the block ids of one pool. It is owned by the scheduler
// goroutine (no locking).
//
// A block is free (on the free list), held (ref > 0 by one or more
// sequences) or cached (ref 0, but holding a full prefix block registered
// under its hash, on the LRU list). A cached block is reused by a sequence
// whose prefix hashes the same, or taken for new data when the free list is
// empty (least recently used first).
type blocks struct {
	size   int       // positions per block
	free   []int32   // free block ids (a stack)
	ref    []int32   // per block: sequences holding it
	hash   []uint64  // per block: its prefix hash when registered, else 0
	toks   [][]int32 // per block: its tokens when registered (checked on a hit)
	byHash map[uint64]int32
	// The LRU of cached blocks: a doubly linked list through prev/next
	// (-1 ends), oldest at head.
	prev, next []int32
	head, tail int32
	inLRU      []bool
	nLRU       int
	held       int // blocks with ref > 0
}

func newBlocks(n, size int) *blocks {
	b := &blocks{size: size, ref: make([]int32, n), hash: make([]uint64, n), toks: make([][]int32, n),
		byHash: map[uint64]int32{}, prev: make([]int32, n), next: make([]int32, n), inLRU: make([]bool, n), head: -1, tail: -1}
	for i := n - 1; i >= 0; i-- {
		b.free = append(b.free, int32(i))
	}
	return b
}

// available is how many blocks an allocation can still get (free plus
// cached ones it may evict).
func (b *blocks) available() int { return len(b.free) + b.nLRU }

// alloc returns a block for new data: a free one, else the least recently
// used cached one (its cache entry dropped). ok is false when every block
// is held.
func (b *blocks) alloc() (int32, bool) {
	var id int32
	switch {
	case len(b.free) > 0:
		id = b.free[len(b.free)-1]
		b.free = b.free[:len(b.free)-1]
	case b.head >= 0:
		id = b.head
		b.unlink(id)
		delete(b.byHash, b.hash[id])
		b.hash[id], b.toks[id] = 0, nil
	default:
		return 0, false
	}
	b.ref[id] = 1
	b.held++
	return id, true
}

// release drops one reference; a block nobody holds goes to the LRU when
// it is registered, else back to the free list.
func (b *blocks) release(id int32) {
	b.ref[id]--
	if b.ref[id] > 0 {
		return
	}
	b.held--
	if b.hash[id] != 0 {
		b.pushLRU(id)
		return
	}
	b.free = append(b.free, id)
}

// lookup finds the cached or held block registered under h with these
// tokens and takes a reference to it.
func (b *blocks) lookup(h uint64, toks []int32) (int32, bool) {
	id, ok := b.byHash[h]
	if !ok || !slices.Equal(b.toks[id], toks) {
		return 0, false
	}
	if b.ref[id] == 0 {
		b.unlink(id)
		b.held++
	}
	b.ref[id]++
	return id, true
}

// register records a full block of a sequence under its prefix hash, so
// later sequences can share it. A hash already registered (another block
// with the same prefix, computed concurrently) keeps its first block.
func (b *blocks) register(id int32, h uint64, toks []int32) {
	if _, ok := b.byHash[h]; ok || b.hash[id] != 0 {
		return
	}
	b.byHash[h] = id
	b.hash[id] = h
	b.toks[id] = slices.Clone(toks)
}

func (b *blocks) pushLRU(id int32) {
	b.prev[id], b.next[id] = b.tail, -1
	if b.tail >= 0 {
		b.next[b.tail] = id
	} else {
		b.head = id
	}
	b.tail = id
	b.inLRU[id] = true
	b.nLRU++
}

func (b *blocks) unlink(id int32) {
	if !b.inLRU[id] {
		return
	}
	p, n := b.prev[id], b.next[id]
	if p >= 0 {
		b.next[p] = n
	} else {
		b.head = n
	}
	if n >= 0 {
		b.prev[n] = p
	} else {
		b.tail = p
	}
	b.inLRU[id] = false
	b.nLRU--
}

// chainHash is the hash of a full block: the model's identity, the hash of
// the block before it (0 for the first) and the block's tokens. Equal
// hashes mean an equal prefix up to this block's end (tokens are checked
// too on a hit, against a collision of the 64-bit hash).
func chainHash(model string, prev uint64, toks []int32) uint64 {
	h := fnv.New64a()
	h.Write([]byte(model))
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], prev)
	h.Write(buf[:])
	for _, t := range toks {
		binary.LittleEndian.PutUint32(buf[:4], uint32(t))
		h.Write(buf[:4])
	}
	s := h.Sum64()
	if s == 0 {
		s = 1 // 0 means "not registered"
	}
	return s
}
