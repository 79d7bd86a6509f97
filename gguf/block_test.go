package gguf

import "testing"

func TestBlockOf(t *testing.T) {
	cases := []struct {
		name    string
		layer   int
		inBlock bool
		bad     bool
	}{
		{"token_embd.weight", -1, false, false},
		{"blk.0.attn_q.weight", 0, true, false},
		{"blk.31.ffn_down.weight", 31, true, false},
		{"blk.x.attn_q.weight", -1, true, true},
		{"blk.-1.attn_q.weight", -1, true, true},
		{"blk.+1.attn_q.weight", -1, true, true},
		{"blk..attn_q.weight", -1, true, true},
	}
	for _, c := range cases {
		l, in, err := BlockOf(c.name)
		if l != c.layer || in != c.inBlock || (err != nil) != c.bad {
			t.Errorf("BlockOf(%q) = %d, %v, %v; want %d, %v, error %v", c.name, l, in, err, c.layer, c.inBlock, c.bad)
		}
	}
	if n := BlockTensor(7, "attn_k.weight"); n != "blk.7.attn_k.weight" {
		t.Errorf("BlockTensor = %q", n)
	}
	if l, _, err := BlockOf(BlockTensor(12, "ffn_up.weight")); l != 12 || err != nil {
		t.Errorf("round trip: %d %v", l, err)
	}
}
