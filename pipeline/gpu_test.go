package pipeline

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/rocm"
)

// envRequireGPU turns "no GPU" from a skip into a failure, as in packages
// rocm and kernels/gpu: the GPU machine sets it so a missing driver can not
// pass.
const envRequireGPU = "FORGE_REQUIRE_GPU"

// needGPU skips (or, with FORGE_REQUIRE_GPU=1, fails) without a GPU.
func needGPU(t *testing.T) {
	t.Helper()
	ch, err := rocm.Choose(rocm.Selection{Kind: rocm.SelectGPU})
	if err == nil && !ch.CPU {
		return
	}
	if os.Getenv(envRequireGPU) == "1" {
		t.Fatalf("no GPU, and %s=1: %v", envRequireGPU, err)
	}
	t.Skipf("no GPU (set %s=1 to make this a failure): %v", envRequireGPU, err)
}

// deviceFree is the device's free memory, read through a worker of its own
// (closed before returning, so it holds nothing afterwards).
func deviceFree(t *testing.T) uint64 {
	t.Helper()
	rt, err := rocm.OpenAny()
	if err != nil {
		t.Fatal(err)
	}
	w, err := rt.NewWorker(0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var free uint64
	if err := w.Do(context.Background(), func(c *rocm.Ctx) error {
		var err error
		free, _, err = c.MemInfo()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return free
}

// checkDeviceFree checks that free device memory is back to before (the
// driver's own bookkeeping may move it by a few pages; a leaked arena or
// staging ring is megabytes).
func checkDeviceFree(t *testing.T, before uint64) {
	t.Helper()
	after := deviceFree(t)
	t.Logf("device free memory: before %d MiB, after %d MiB (diff %d bytes)", before>>20, after>>20, int64(after)-int64(before))
	if before > after && before-after > 2<<20 {
		t.Errorf("device free memory %d bytes lower after Close: leaked", before-after)
	}
}

// TestGPUTokensMatchCPU: every strategy on the GPU gives the CPU backend's
// greedy tokens, and the device's memory is back where it started.
func TestGPUTokensMatchCPU(t *testing.T) {
	needGPU(t)
	refs := references(t)
	before := deviceFree(t)
	for _, file := range []string{"stories260K-F32.gguf", "stories260K-Q4_0.gguf", "synth-kq-Q4_K_M.gguf"} {
		ref := refs[file]
		path := testmodels.Path(t, file)
		t.Run(file, func(t *testing.T) {
			cpu := generateWith(t, path, Options{Device: "cpu"}, ref)
			for _, s := range []Strategy{Prefetch, Eager, Lazy, HostF32} {
				got := generateWith(t, path, Options{Device: "gpu", Strategy: s}, ref)
				if !slices.Equal(got, cpu) {
					t.Errorf("%s on the GPU: got %v\nCPU gave %v", s, got, cpu)
				} else {
					t.Logf("%s %s: GPU = CPU (%d tokens)", file, s, len(got))
				}
			}
		})
	}
	checkDeviceFree(t, before)
}

// TestGPUFaults: a failed upload and a device out of memory fail the
// request naming the tensor or layer, resolve every future, and leave no
// device memory and no goroutine behind.
func TestGPUFaults(t *testing.T) {
	needGPU(t)
	path := testmodels.Path(t, "stories260K-Q4_0.gguf")
	before := deviceFree(t)
	faultCase(t, path, Options{Device: "gpu", Hooks: Hooks{Upload: func(tensor string) error {
		if tensor == "blk.1.attn_q.weight" {
			return fmt.Errorf("injected copy failure")
		}
		return nil
	}}}, "layer 1", "blk.1.attn_q.weight", "injected copy failure")
	err := faultCase(t, path, Options{Device: "gpu", Memory: NewMemory(64 << 10)}, "weight arena", "out of memory")
	if !errors.Is(err, actors.ErrOutOfMemory) {
		t.Errorf("error %v is not ErrOutOfMemory", err)
	}
	err = faultCase(t, path, Options{Device: "gpu", Strategy: HostF32, Memory: NewMemory(600 << 10)}, "tensor", "out of memory")
	var le *actors.LoadError
	if !errors.As(err, &le) || le.Tensor == "" {
		t.Errorf("host-f32 error %v does not name a tensor", err)
	}
	checkDeviceFree(t, before)
	goleak.VerifyNone(t)
}

// TestGPUCancelMidLoad: cancelling the load while the blocks are held back
// fails the waiting request quickly and Close releases the device.
func TestGPUCancelMidLoad(t *testing.T) {
	needGPU(t)
	path := testmodels.Path(t, "stories260K-Q4_0.gguf")
	before := deviceFree(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, err := Open(ctx, path, Options{Device: "gpu", Hooks: Hooks{Read: slowReads}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Ready().Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := m.Generate(context.Background(), "", GenerateOptions{PromptIDs: storiesPrompt, MaxTokens: 4})
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond) // the request is waiting on layer 0
	t0 := time.Now()
	cancel()
	err = <-errc
	dGen := time.Since(t0)
	if err == nil || !errors.Is(err, context.Canceled) {
		t.Errorf("request error %v, want cancelled", err)
	}
	t1 := time.Now()
	if err := m.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	dClose := time.Since(t1)
	t.Logf("cancel → request returned in %v; Close took %v", dGen, dClose)
	if dGen > 100*time.Millisecond {
		t.Errorf("request returned %v after cancel (issue asks < 100 ms)", dGen)
	}
	checkDeviceFree(t, before)
}

// TestGPULoadTiming logs the start-up figures of the GPU pipeline: Open's
// return, the context becoming current, ready (embedding and head
// resident) and all resident, for stories260K and, when FORGE_BIG_MODEL
// names a file, a big one. Figures, not assertions (DESIGN.md).
func TestGPULoadTiming(t *testing.T) {
	needGPU(t)
	paths := []string{testmodels.Path(t, "stories260K-Q4_0.gguf")}
	if big := os.Getenv("FORGE_BIG_MODEL"); big != "" {
		paths = append(paths, big)
	}
	for _, path := range paths {
		for _, s := range []Strategy{Prefetch, Eager, HostF32} {
			for run := range 2 { // the first run also pays for compiling kernels into the cache
				t0 := time.Now()
				m, err := Open(context.Background(), path, Options{Device: "gpu", Strategy: s})
				if err != nil {
					t.Fatal(err)
				}
				open := time.Since(t0)
				if err := m.Ready().Wait(context.Background()); err != nil {
					m.Close()
					t.Fatal(err)
				}
				ready := time.Since(m.Started())
				if err := m.Resident().Wait(context.Background()); err != nil {
					m.Close()
					t.Fatal(err)
				}
				resident := time.Since(m.Started())
				ctxAt := m.ContextCurrent()
				res, err := m.Generate(context.Background(), "", GenerateOptions{PromptIDs: storiesPrompt, MaxTokens: 1})
				first := time.Since(m.Started())
				if err != nil {
					m.Close()
					t.Fatal(err)
				}
				var bytes int64
				for _, u := range m.sys.Plan().Units {
					bytes += u.Bytes
				}
				m.Close()
				t.Logf("GPU-LOAD %s %s run %d: open %.1f ms, context current %.1f ms, ready %.1f ms (%.1f ms after context), all resident %.1f ms (%.2f GB/s after context), first token %.1f ms, %d file bytes, %d tokens",
					filepath.Base(path), s, run, msf(open), msf(ctxAt), msf(ready), msf(ready-ctxAt), msf(resident),
					float64(bytes)/(resident-ctxAt).Seconds()/1e9, msf(first), bytes, len(res.Tokens))
				if strings.HasPrefix(filepath.Base(path), "stories") && s != Prefetch {
					break // one run is enough for the small file's other strategies
				}
			}
		}
	}
}

func msf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
