package actors

import (
	"context"
	"testing"

	"github.com/forge-llm/forge/gguf"
)

// TestDemandExpertsLoadsThemTogether: under Lazy an expert loads only when
// asked for; DemandExperts asks for several in one message, and exactly
// those become resident, without a wait having asked (a wait on a Future
// does not demand). Asking again, or for one that is resident, is a no-op.
func TestDemandExpertsLoadsThemTogether(t *testing.T) {
	path := writeMixture(t)
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(context.Background(), Config{File: f, Layers: 2, Readers: 1, ChunkBytes: 100, Strategy: Lazy})
	if err != nil {
		f.Close()
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if err := s.WaitLayer(ctx, 1); err != nil {
		t.Fatal(err)
	}
	s.DemandExperts(1, []int{3, 1, 3})
	for _, e := range []int{3, 1} {
		if err := s.ExpertFuture(1, e).Wait(ctx); err != nil {
			t.Fatalf("expert %d: %v", e, err)
		}
	}
	s.DemandExperts(1, []int{1})
	if got := s.ExpertsResident(1); got != 2 {
		t.Errorf("layer 1: %d experts resident, want the 2 asked for", got)
	}
	if got := s.ExpertsResident(0); got != 0 {
		t.Errorf("layer 0: %d experts resident, none asked for", got)
	}
}
