package model_test

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/pipeline/internal/archtest"
	"github.com/forge-llm/forge/pipeline/model"
)

// TestArchGreedyQ8Checked runs every architecture's tiny preset on the CPU
// backend wrapped in the q8 checker, which gives the model 8-bit copies of
// its activations (kernels.Q8Ops) and fails any product handed a copy
// that is not its input's as the input is now: the greedy ids must be
// llama.cpp's, every logit of every step bit for bit the plain CPU
// backend's, and the copies must have been used.
func TestArchGreedyQ8Checked(t *testing.T) {
	exp := archtest.Read(t)
	dir := t.TempDir()
	be := cpu.New(2)
	defer be.Close()
	ctx := context.Background()
	for _, preset := range archtest.Presets {
		c := exp.Case(t, preset)
		path := archtest.WriteFile(t, dir, preset, c)
		for _, oneRow := range []bool{false, true} {
			name := preset + "/all"
			if oneRow {
				name = preset + "/one-row"
			}
			t.Run(name, func(t *testing.T) {
				chk, counts := model.NewQ8Checker(be, oneRow)
				plain := model.OpenModel(t, path, be, model.Options{Ctx: 64})
				checked := model.OpenModel(t, path, chk, model.Options{Ctx: 64})
				toks, pos := c.PromptIDs, 0
				var ids []int32
				for len(ids) < archtest.Tokens {
					want, err := plain.Forward(ctx, toks, pos)
					if err != nil {
						t.Fatal(err)
					}
					got, err := checked.Forward(ctx, toks, pos)
					if err != nil {
						t.Fatalf("step %d: %v", len(ids), err)
					}
					for i := range want {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("step %d: logit %d = %g, the plain CPU backend's %g", len(ids), i, got[i], want[i])
						}
					}
					pos += len(toks)
					best := int32(0)
					for i, v := range got {
						if v > got[best] {
							best = int32(i)
						}
					}
					ids = append(ids, best)
					toks = []int32{best}
				}
				if !slices.Equal(ids, c.GeneratedIDs[:archtest.Tokens]) {
					t.Errorf("greedy ids\n got %v\nwant %v (llama.cpp)", ids, c.GeneratedIDs[:archtest.Tokens])
				}
				filled, read := counts()
				t.Logf("%d rows copied, %d products on a copy", filled, read)
				if filled == 0 || read == 0 {
					t.Errorf("%d rows copied, %d products on a copy: the model used no copies", filled, read)
				}
			})
		}
	}
}
