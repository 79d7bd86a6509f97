package pipeline

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/rocm"
)

// deviceUploader is the uploader that streams a model's weights into one
// device arena on w (per tensor for host-f32, whose tensors are F32
// copies), sized by t.
func deviceUploader(w *rocm.Worker, t UploadTuning, s Strategy, mem *actors.Memory) *actors.DeviceUploader {
	return &actors.DeviceUploader{
		W: w, Mem: mem, PerTensor: s == HostF32, Ahead: s != Lazy,
		Register: t.Register, Unpaced: t.Unpaced,
		RingBuffers: t.RingBuffers, RingBytes: t.RingBytes, Stagers: t.Stagers,
		RegThreads: t.RegThreads, RegBytes: t.RegBytes,
	}
}

// Parse sets the fields named in spec, a comma-separated list of "reg"
// (Register), "unpaced" (Unpaced) and key=value: st stagers, rn ring
// buffers, rs ring MiB, rt registration threads, rb registration MiB. The CLI's --gpu-upload
// flag takes the same list, for benchmarks of a whole process (forge run,
// forge serve, forge bench load).
func (t UploadTuning) Parse(spec string) (UploadTuning, error) {
	for _, kv := range strings.Split(spec, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		if kv == "reg" {
			t.Register = true
			continue
		}
		if kv == "unpaced" {
			t.Unpaced = true
			continue
		}
		k, v, _ := strings.Cut(kv, "=")
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return t, fmt.Errorf("upload setting %q: want a positive number", kv)
		}
		switch k {
		case "st":
			t.Stagers = n
		case "rn":
			t.RingBuffers = n
		case "rs":
			t.RingBytes = n << 20
		case "rt":
			t.RegThreads = n
		case "rb":
			t.RegBytes = int64(n) << 20
		default:
			return t, fmt.Errorf("unknown upload setting %q (reg, unpaced, st, rn, rs, rt, rb)", kv)
		}
	}
	return t, nil
}
