package cpu

import (
	"sync"
	"testing"
)

// coverTask records which worker ran each item and the chunks it got.
type coverTask struct {
	mu     sync.Mutex
	seen   []int
	chunks [][2]int
}

func (c *coverTask) run(_, lo, hi int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := lo; i < hi; i++ {
		c.seen[i]++
	}
	c.chunks = append(c.chunks, [2]int{lo, hi})
}

// TestPoolGuided: a guided loop runs every item exactly once, in chunks
// that are whole multiples of the step (but the last), the first ones
// longer than the last ones.
func TestPoolGuided(t *testing.T) {
	for _, threads := range []int{1, 2, 3, 8} {
		p := newPool(threads)
		for _, tc := range []struct{ total, step int }{{1, 4}, {7, 4}, {768, 4}, {2048, 4}, {1000, 1}, {513, 8}} {
			c := &coverTask{seen: make([]int, tc.total)}
			if err := p.parallelGuided(c, tc.total, tc.step); err != nil {
				t.Fatal(err)
			}
			for i, n := range c.seen {
				if n != 1 {
					t.Fatalf("threads %d total %d step %d: item %d ran %d times", threads, tc.total, tc.step, i, n)
				}
			}
			first, last := tc.total, 0
			for _, ch := range c.chunks {
				if n := ch[1] - ch[0]; ch[1] != tc.total && n%tc.step != 0 {
					t.Errorf("threads %d total %d: chunk %v is not a multiple of %d", threads, tc.total, ch, tc.step)
				}
				if ch[0] == 0 {
					first = ch[1] - ch[0]
				}
				if ch[1] == tc.total {
					last = ch[1] - ch[0]
				}
			}
			if threads > 1 && tc.total >= 64*tc.step && first <= last {
				t.Errorf("threads %d total %d: first chunk %d, last %d; want shrinking chunks", threads, tc.total, first, last)
			}
		}
		p.close()
	}
}
