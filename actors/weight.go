package actors

import "github.com/forge-llm/forge/kernels"

// placedWeight is the backend's view of t once its bytes are in place: at
// device address dev (0 on the host) and/or in host memory host (nil where
// the bytes have no host copy). Every uploader builds its Weights here, so
// the name, type and shape come from the plan in one way only.
func placedWeight(t *Tensor, dev uintptr, host []byte) *kernels.Weight {
	return &kernels.Weight{
		Name: t.Name(), Type: t.To, Cols: int(t.Info.Dims[0]), Rows: int(t.Info.Rows()),
		Dev: dev, Host: host,
	}
}
