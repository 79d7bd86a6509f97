package pipeline

import "github.com/forge-llm/forge/gguf"

// prefetchFile asks the kernel to start reading f's tensor data into the
// page cache (globals first, then the blocks in file order) while the GPU
// driver starts: MADV_WILLNEED only queues readahead, so this costs the
// caller little and the loader later finds the pages resident.
func prefetchFile(f *gguf.File) {
	for i := range f.Tensors {
		b, err := f.TensorData(&f.Tensors[i])
		if err != nil || len(b) == 0 {
			continue
		}
		willNeed(b)
	}
}
