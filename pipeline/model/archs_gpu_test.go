package model_test

import (
	"testing"

	"github.com/forge-llm/forge/pipeline/model"
)

// TestArchGreedyGPU: every architecture's tiny preset gives llama.cpp's
// greedy tokens on the GPU, through Forward op by op and through Greedy
// (the device's argmax and the recorded decode step). Skips without a GPU
// (fails with FORGE_REQUIRE_GPU=1).
func TestArchGreedyGPU(t *testing.T) {
	be := model.OpenGPU(t)
	t.Run("forward", func(t *testing.T) { checkArchGreedy(t, be, viaIDs) })
	t.Run("greedy", func(t *testing.T) { checkArchGreedy(t, be, viaDevice) })
}
