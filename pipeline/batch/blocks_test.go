package batch

import "testing"

// TestBlocksLRU: registered blocks nobody holds are kept, found again by
// hash (and tokens), and taken for new data least recently used first,
// only once the free list is empty.
func TestBlocksLRU(t *testing.T) {
	b := newBlocks(4, 2)
	var ids []int32
	for range 4 {
		id, ok := b.alloc()
		if !ok {
			t.Fatal("alloc from a fresh pool failed")
		}
		ids = append(ids, id)
	}
	if _, ok := b.alloc(); ok || b.available() != 0 || b.held != 4 {
		t.Fatalf("a full pool: alloc ok=%v available %d held %d", ok, b.available(), b.held)
	}
	h := []uint64{chainHash("m", 0, []int32{1, 2}), chainHash("m", 1, []int32{3, 4})}
	b.register(ids[0], h[0], []int32{1, 2})
	b.register(ids[1], h[1], []int32{3, 4})
	if h2 := chainHash("other", 0, []int32{1, 2}); h2 == h[0] {
		t.Errorf("two models share a prefix hash")
	}
	b.release(ids[1]) // cached: the older LRU entry
	b.release(ids[0]) // cached
	b.release(ids[2]) // free
	if b.held != 1 || b.nLRU != 2 || len(b.free) != 1 || b.available() != 3 {
		t.Fatalf("after releases: held %d lru %d free %d", b.held, b.nLRU, len(b.free))
	}
	// A hit takes a cached block back; wrong tokens under the same hash miss.
	if _, ok := b.lookup(h[0], []int32{9, 9}); ok {
		t.Errorf("a lookup with other tokens hit")
	}
	if id, ok := b.lookup(h[0], []int32{1, 2}); !ok || id != ids[0] || b.nLRU != 1 || b.held != 2 {
		t.Fatalf("lookup: %d %v (lru %d held %d)", id, ok, b.nLRU, b.held)
	}
	// The free block goes first, then the least recently used cached one.
	if id, _ := b.alloc(); id != ids[2] {
		t.Errorf("alloc took %d before the free block %d", id, ids[2])
	}
	if id, _ := b.alloc(); id != ids[1] {
		t.Errorf("alloc evicted %d, want the cached block %d", id, ids[1])
	}
	if _, ok := b.lookup(h[1], []int32{3, 4}); ok {
		t.Errorf("an evicted block was found by its hash")
	}
	// A block held twice goes back once both let go.
	b.lookup(h[0], []int32{1, 2})
	b.release(ids[0])
	if b.ref[ids[0]] != 1 || b.nLRU != 0 {
		t.Errorf("a shared block released once: ref %d lru %d", b.ref[ids[0]], b.nLRU)
	}
}
