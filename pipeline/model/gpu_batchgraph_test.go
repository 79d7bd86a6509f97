package model

import (
	"context"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/kernels"
)

// graphSchedule is a serving engine's life in batched steps: sequences
// join (their prompt a piece of the step, beside the others' decode rows),
// decode together, and leave. Its pure decode steps run 1, 2, 3, 16, 64,
// 20, 3 and 1 rows (one of 64 rows is 48 sequences joining with a
// one-token prompt), one sequence crossing position 256 (attention's
// second split, another recorded shape) on the way; a 300-token prompt
// joining after the 64-row step was recorded outgrows the layout buffer,
// so that recording is stale when that shape comes back and must be made
// again.
type graphSchedule struct {
	prompt []int // per sequence: its prompt length
	join   []int // per sequence: the step it joins at
	leave  []int // per sequence: the step it is gone by
	steps  int
	tables [][]int32 // per sequence: its block table
	blocks int
}

func newGraphSchedule(bs int) graphSchedule {
	const seqs = 65
	s := graphSchedule{prompt: make([]int, seqs), join: make([]int, seqs), leave: make([]int, seqs), steps: 32}
	for i := range seqs {
		s.prompt[i], s.leave[i] = 3+i%7, s.steps
		switch {
		case i == 0:
			s.prompt[i] = 240 // decodes at 240…, past 256 from step 17
		case i == 1:
			s.join[i] = 4
		case i == 2:
			s.join[i] = 8
		case i < 16:
			s.join[i] = 12
		case i < 64: // one-token prompts: the joining step is a decode group
			s.prompt[i], s.join[i] = 1, 16
		default: // takes the place of sequence 63 with a long prompt
			s.prompt[i], s.join[i] = 300, 20
		}
		if i == 63 {
			s.leave[i] = 20
		}
		if i >= 20 && i <= 64 {
			s.leave[i] = min(s.leave[i], 24)
		}
		if i >= 3 && i < 20 {
			s.leave[i] = 27
		}
		if i >= 1 && i < 3 {
			s.leave[i] = 30
		}
	}
	for i := range seqs {
		need := (s.prompt[i] + s.steps + bs - 1) / bs
		var tab []int32
		for range need {
			tab = append(tab, int32(s.blocks))
			s.blocks++
		}
		s.tables = append(s.tables, tab)
	}
	return s
}

// graphStep is what one step gave: per row of the step, the logits (odd
// sequences, which sample) or the device's pick (even ones, greedy).
type graphStep struct {
	rows   int
	seqs   []int
	logits [][]float32
	picks  []int32
}

// runGraphSchedule runs the schedule through bm; next, when not nil, gives
// the token each sequence feeds next (the other run's choices), so both
// runs see the same inputs even if their outputs differ.
func runGraphSchedule(t *testing.T, bm *Model, pool *kernels.KVPool, s graphSchedule, vocab int, next [][]int32, before ...func(step int)) ([]graphStep, [][]int32) {
	t.Helper()
	ctx := context.Background()
	pos := make([]int, len(s.prompt))
	fed := make([][]int32, len(s.prompt)) // per sequence: its token at each of its decode steps
	var out []graphStep
	for step := range s.steps {
		var rows []SeqRows
		var who []int
		for i := range s.prompt {
			if step < s.join[i] || step >= s.leave[i] {
				continue
			}
			r := SeqRows{Pos0: pos[i], Table: s.tables[i], Logits: true, Greedy: i%2 == 0}
			if step == s.join[i] {
				for k := range s.prompt[i] {
					r.Tokens = append(r.Tokens, int32(1+(i*131+k*17)%(vocab-1)))
				}
			} else {
				r.Tokens = []int32{fed[i][len(fed[i])-1]}
			}
			rows = append(rows, r)
			who = append(who, i)
		}
		for _, f := range before {
			f(step)
		}
		logits, err := bm.StepBatch(ctx, pool, rows)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		gs := graphStep{rows: len(rows), seqs: who, picks: append([]int32(nil), bm.Picks()...)}
		k := 0
		for j, i := range who {
			pos[i] += len(rows[j].Tokens)
			var tok int32
			if rows[j].Greedy {
				tok = gs.picks[j]
				gs.logits = append(gs.logits, nil)
			} else {
				tok = argmax(logits[k])
				gs.logits = append(gs.logits, append([]float32(nil), logits[k]...))
			}
			k++
			if next != nil {
				tok = next[i][len(fed[i])]
			}
			fed[i] = append(fed[i], tok)
		}
		out = append(out, gs)
	}
	return out, fed
}

// TestGPUBatchGraph: on the GPU, batched decode steps recorded once per
// shape and replayed give exactly (bit for bit) the logits and device
// picks of the same steps run op by op, at every step of a schedule whose
// decode steps have 1, 2, 3, 16, 64 and 20 rows, sequences joining and
// leaving between them; the shapes are recorded once each, and again
// where the layout buffer moved under a recording (a stale graph). With
// FORGE_PAGED_ATTN=coarse (attn_paged, whose grid follows the positions)
// the shapes include attention's splits too.
func TestGPUBatchGraph(t *testing.T) {
	for _, file := range []string{"stories260K-Q4_K_M.gguf", "synth-kq-Q4_K_M.gguf"} {
		t.Run(file, func(t *testing.T) {
			// A backend of its own, whose layout buffer grows during the
			// recorded run (the run op by op comes second).
			be := openGPU(t)
			_, cfg, w := openWeights(t, testmodels.Path(t, file))
			const bs = 16
			s := newGraphSchedule(bs)
			var runs [2][]graphStep
			var fed [][]int32
			var captures int
			var shapes map[batchKey]bool
			for ri, noGraph := range []bool{false, true} {
				bm, err := NewBatched(be, cfg, w, BatchOptions{MaxRows: 512, MaxSeqs: kernels.MaxBatchRows, NoGraph: noGraph})
				if err != nil {
					t.Fatal(err)
				}
				if !noGraph && bm.bat.graph.sc == nil {
					t.Fatal("the GPU backend does not record batched steps (kernels.BatchStepCapturer)")
				}
				pool, err := be.NewKVPool(cfg.Layers, s.blocks, bs, cfg.KVDim())
				if err != nil {
					t.Fatal(err)
				}
				runs[ri], fed = runGraphSchedule(t, bm, pool, s, cfg.Vocab, fed)
				if !noGraph {
					if bm.bat.graph.off {
						t.Error("a batched step could not be recorded (see the log)")
					}
					captures, shapes = bm.bat.graph.recorded, map[batchKey]bool{}
					for k := range bm.bat.graph.g {
						shapes[k] = true
					}
				}
				bm.Close()
				if n := len(bm.bat.graph.g); n != 0 {
					t.Errorf("after Close the model holds %d recorded steps", n)
				}
				be.FreeKVPool(pool)
			}
			sameSteps(t, "replayed", runs[1], runs[0])
			rows := map[int]bool{}
			for k := range shapes {
				rows[k.rows] = true
			}
			for _, n := range []int{1, 2, 3, 16, 64, 20} {
				if !rows[n] {
					t.Errorf("no step of %d rows was recorded (recorded: %v)", n, shapes)
				}
			}
			if captures <= len(shapes) {
				t.Errorf("%d recordings of %d shapes: the stale 64-row step was not recorded again", captures, len(shapes))
			}
			t.Logf("%d steps, %d shapes recorded, %d recordings", len(runs[0]), len(shapes), captures)
		})
	}
}
