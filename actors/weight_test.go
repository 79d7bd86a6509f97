package actors

import (
	"testing"

	"github.com/forge-llm/forge/gguf"
)

// TestPlacedWeight checks the one constructor every uploader builds its
// Weights with: name, backend type (To, not the file's type) and shape come
// from the plan's tensor, the placement from the caller.
func TestPlacedWeight(t *testing.T) {
	info := &gguf.TensorInfo{Name: "blk.0.ffn_up.weight", Dims: []uint64{64, 3, 2}, Type: gguf.TypeQ8_0}
	tt := &Tensor{Info: info, To: gguf.TypeF16}
	host := make([]byte, 64*6*2)

	w := placedWeight(tt, 0x1000, host)
	if w.Name != info.Name || w.Type != gguf.TypeF16 || w.Cols != 64 || w.Rows != 6 {
		t.Fatalf("placedWeight = {Name %q Type %v Cols %d Rows %d}, want {%q %v 64 6}",
			w.Name, w.Type, w.Cols, w.Rows, info.Name, gguf.TypeF16)
	}
	if w.Dev != 0x1000 || len(w.Host) != len(host) || &w.Host[0] != &host[0] {
		t.Fatalf("placedWeight placement = Dev %#x, %d host bytes; want Dev 0x1000 and the caller's %d bytes",
			w.Dev, len(w.Host), len(host))
	}

	if w := placedWeight(tt, 0, nil); w.Dev != 0 || w.Host != nil {
		t.Fatalf("placedWeight(t, 0, nil) = Dev %#x, Host %d bytes; want neither", w.Dev, len(w.Host))
	}
}
