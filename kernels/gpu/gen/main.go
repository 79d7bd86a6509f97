// Command gen compiles every kernel module of package gpu for the shipped
// targets and writes the compressed objects and their manifest into the
// objects folder (kernels/gpu/obj), which the gpu package embeds.
//
// HIP objects are made through hiprtc (ROCm's libamdhip64/libhiprtc, no GPU
// needed); CUDA cubins and PTX through nvrtc (libnvrtc, no GPU needed
// either, but it is installed only on the GPU machine here, so the
// generator is cross-built there: see bench/kernels-gen.sh). Each run
// replaces the entries of the targets it built and keeps the others.
//
//	go run ./kernels/gpu/gen -backend hip
//	kernels-gen -backend cuda -dir /tmp/obj        # on the GPU machine
//	go run ./kernels/gpu/gen -merge /tmp/obj       # back here
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/forge-llm/forge/kernels/gpu"
	"github.com/forge-llm/forge/rocm"
)

// The default targets. CUDA: cubins for Ampere (A100 sm_80, consumer sm_86),
// Ada (sm_89) and Hopper (sm_90), and PTX for compute_80, which any newer
// device (Blackwell…) compiles at load. HIP: what ROCm 5.2's hiprtc accepts
// of CDNA2 (gfx90a), CDNA1 (gfx908) and RDNA2 (gfx1030); it
// crashes on gfx942 and gfx1100 (newer ROCm is needed for those).
const (
	defaultCUDA = "sm_80,sm_86,sm_89,sm_90"
	defaultPTX  = "compute_80"
	defaultHIP  = "gfx90a,gfx908,gfx1030"
)

func main() {
	backend := flag.String("backend", "", "cuda or hip")
	archs := flag.String("arch", "", "targets, comma-separated (default: cuda "+defaultCUDA+"; hip "+defaultHIP+")")
	ptx := flag.String("ptx", defaultPTX, "cuda: virtual archs to ship as PTX, comma-separated")
	dir := flag.String("dir", filepath.Join("kernels", "gpu", "obj"), "objects folder")
	merge := flag.String("merge", "", "copy the objects and manifest entries of this folder into -dir (no compiling)")
	flag.Parse()
	var err error
	if *merge != "" {
		err = mergeDir(*merge, *dir)
	} else {
		err = generate(*backend, *archs, *ptx, *dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kernels-gen:", err)
		os.Exit(1)
	}
}

type job struct{ arch, kind string }

func generate(backend, archs, ptx, dir string) error {
	var jobs []job
	var b rocm.Backend
	switch backend {
	case "cuda":
		b = rocm.CUDA
		if archs == "" {
			archs = defaultCUDA
		}
		for _, a := range split(archs) {
			jobs = append(jobs, job{a, "cubin"})
		}
		for _, a := range split(ptx) {
			jobs = append(jobs, job{a, "ptx"})
		}
	case "hip":
		b = rocm.HIP
		if archs == "" {
			archs = defaultHIP
		}
		for _, a := range split(archs) {
			jobs = append(jobs, job{a, "hsaco"})
		}
	default:
		return fmt.Errorf("-backend %q: want cuda or hip", backend)
	}
	major, minor, err := rocm.RTCVersion(b)
	if err != nil {
		return err
	}
	compiler := fmt.Sprintf("%s %d.%d", map[rocm.Backend]string{rocm.CUDA: "nvrtc", rocm.HIP: "hiprtc"}[b], major, minor)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	man, err := readOrNew(dir)
	if err != nil {
		return err
	}
	type result struct {
		obj gpu.ShippedObject
		err error
	}
	var tasks []func() result
	for _, m := range gpu.Modules() {
		hash, err := gpu.SourceHash(m, gpu.CompileOptions)
		if err != nil {
			return err
		}
		src, err := gpu.Source(m)
		if err != nil {
			return err
		}
		for _, j := range jobs {
			tasks = append(tasks, func() result {
				t := time.Now()
				var code []byte
				var err error
				switch j.kind {
				case "cubin":
					code, err = rocm.CompileCUDA(src, m, j.arch, gpu.CompileOptions)
				case "ptx":
					code, err = rocm.CompilePTX(src, m, j.arch, gpu.CompileOptions)
				case "hsaco":
					code, err = rocm.CompileHIP(src, m, j.arch, gpu.CompileOptions)
				}
				if err != nil {
					return result{err: fmt.Errorf("%s for %s: %w", m, j.arch, err)}
				}
				o, err := gpu.WriteObject(dir, m, backend, j.arch, j.kind, hash, compiler, code)
				slog.Info("kernel object", "module", m, "arch", j.arch, "kind", j.kind, "bytes", len(code), "took", time.Since(t).Round(time.Millisecond))
				return result{o, err}
			})
		}
	}
	results := make([]result, len(tasks))
	if b == rocm.CUDA {
		// nvrtc compiles programs concurrently; hiprtc 5.2 crashes doing so.
		var wg sync.WaitGroup
		sem := make(chan struct{}, 16)
		for i, t := range tasks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				results[i] = t()
				<-sem
			}()
		}
		wg.Wait()
	} else {
		for i, t := range tasks {
			results[i] = t()
		}
	}
	var objs []gpu.ShippedObject
	for _, r := range results {
		if r.err != nil {
			return r.err
		}
		objs = append(objs, r.obj)
	}
	man.Merge(objs)
	return writeManifest(dir, man)
}

func readOrNew(dir string) (*gpu.Manifest, error) {
	man, err := gpu.ReadManifest(os.DirFS(dir))
	if err != nil {
		if _, serr := os.Stat(filepath.Join(dir, gpu.ManifestFile)); os.IsNotExist(serr) {
			return &gpu.Manifest{Version: 1}, nil
		}
		return nil, err
	}
	return man, nil
}

func writeManifest(dir string, man *gpu.Manifest) error {
	b, err := json.MarshalIndent(man, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, gpu.ManifestFile), append(b, '\n'), 0o644)
}

// mergeDir copies the objects listed in from's manifest into dir and merges
// the entries.
func mergeDir(from, dir string) error {
	src, err := gpu.ReadManifest(os.DirFS(from))
	if err != nil {
		return err
	}
	man, err := readOrNew(dir)
	if err != nil {
		return err
	}
	for _, o := range src.Objects {
		if err := copyFile(filepath.Join(from, o.File), filepath.Join(dir, o.File)); err != nil {
			return err
		}
	}
	man.Merge(src.Objects)
	return writeManifest(dir, man)
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
