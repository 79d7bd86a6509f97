package gpu

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/forge-llm/forge/rocm"
)

// The compiled kernels shipped in the binary: one gzip-compressed object per
// (module, target) under obj/, listed in obj/manifest.json. A fresh machine
// loads them instead of compiling through nvrtc/hiprtc, which took the H100
// 10.8 s before the first token with an empty kernel cache. They are made by
// `make kernels` (kernels/gpu/gen); TestShippedObjectsMatchSources fails
// when a kernel source changes without them being regenerated.
//
//go:embed obj
var shippedFS embed.FS

// EnvKernelObjects overrides the shipped kernel objects: "off" compiles
// every module at run time (the path of an arch with no shipped object);
// a directory holding a manifest.json reads the objects from there instead
// of from the binary (objects made after the build, for measurements).
const EnvKernelObjects = "FORGE_KERNEL_OBJECTS"

// ManifestFile is the name of the manifest in the objects folder.
const ManifestFile = "manifest.json"

// CompileOptions are the options every module is compiled with, at run time
// and by the generator; they are part of SourceHash.
var CompileOptions []string

// Manifest lists the shipped kernel objects.
type Manifest struct {
	Version int             `json:"version"`
	Objects []ShippedObject `json:"objects"`
}

// ShippedObject is one compiled module for one target.
type ShippedObject struct {
	Module  string `json:"module"`  // "matvec.cu"
	Backend string `json:"backend"` // "cuda" or "hip"
	Arch    string `json:"arch"`    // "sm_90", "compute_80" (PTX), "gfx90a"
	Kind    string `json:"kind"`    // "cubin", "ptx" or "hsaco"
	File    string `json:"file"`    // gzip file in the objects folder
	// SourceHash is SourceHash(Module, options) of the source it was made
	// from; an object whose hash differs from the current source's is
	// never loaded.
	SourceHash string   `json:"source_hash"`
	Options    []string `json:"options,omitempty"`
	Compiler   string   `json:"compiler"` // "nvrtc 13.0", "hiprtc 5.2"
	Bytes      int      `json:"bytes"`    // uncompressed
	SHA256     string   `json:"sha256"`   // of the uncompressed object
}

// SourceHash identifies what a module's object is compiled from: the
// inlined source text and the exact compile options.
func SourceHash(module string, opts []string) (string, error) {
	src, err := Source(module)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "forge-kernel-source-v1\x00%s\x00%d\x00", module, len(opts))
	for _, o := range opts {
		fmt.Fprintf(h, "%s\x00", o)
	}
	io.WriteString(h, src)
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ShippedObjects returns the folder of kernel objects in use: the embedded
// one, the directory named by $FORGE_KERNEL_OBJECTS, or nil when that is
// "off".
func ShippedObjects() (fs.FS, error) {
	switch v := os.Getenv(EnvKernelObjects); v {
	case "":
		sub, err := fs.Sub(shippedFS, "obj")
		if err != nil {
			return nil, fmt.Errorf("gpu: shipped kernel objects: %w", err)
		}
		return sub, nil
	case "off":
		return nil, nil
	default:
		return os.DirFS(v), nil
	}
}

// ReadManifest reads the manifest of an objects folder; a folder with no
// manifest has no objects.
func ReadManifest(fsys fs.FS) (*Manifest, error) {
	b, err := fs.ReadFile(fsys, ManifestFile)
	if err != nil {
		return nil, fmt.Errorf("gpu: kernel objects manifest: %w", err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("gpu: kernel objects manifest: %w", err)
	}
	if m.Version != 1 {
		return nil, fmt.Errorf("gpu: kernel objects manifest: version %d, want 1", m.Version)
	}
	return &m, nil
}

// archNumber is the compute capability in an "sm_86" / "compute_80" name
// (86, 80); -1 if none.
func archNumber(arch string) int {
	_, n, ok := strings.Cut(arch, "_")
	if !ok {
		return -1
	}
	v, err := strconv.Atoi(n)
	if err != nil {
		return -1
	}
	return v
}

// Pick chooses the object of module for a device of backend ("cuda",
// "hip") and arch (Device.Arch: "sm_90", "gfx90a:sramecc+:xnack-") whose
// source hash is hash. CUDA: the cubin for the exact arch, else the cubin
// of the same major version with the highest minor not above the device's
// (binary compatible), else, only where ptx is set, the PTX of the highest
// virtual arch not above it. PTX is the last resort, for a machine with no
// nvrtc: the driver compiles it at load, one module after another, which
// took the H100 6.6–9.3 s against 0.6–1.0 s for nvrtc compiling the
// modules in parallel (bench/results/2026-11-25-shipped-kernels-h100.md).
// HIP: the code object of the exact gfx target (hiprtc's objects are made
// with sramecc and xnack unspecified, so they load on either setting).
// When none fits it returns nil and why.
func (m *Manifest) Pick(module, backend, arch, hash string, ptx bool) (*ShippedObject, string) {
	var best *ShippedObject
	rank := func(o *ShippedObject) int { // higher is better; <0 unusable
		switch backend {
		case "hip":
			base, _, _ := strings.Cut(arch, ":")
			if o.Kind == "hsaco" && o.Arch == base {
				return 1
			}
		case "cuda":
			dev, n := archNumber(arch), archNumber(o.Arch)
			if dev < 0 || n < 0 || n > dev {
				return -1
			}
			switch {
			case o.Kind == "cubin" && o.Arch == arch:
				return 3000
			case o.Kind == "cubin" && n/10 == dev/10:
				return 2000 + n
			case o.Kind == "ptx" && ptx:
				return 1000 + n
			}
		}
		return -1
	}
	stale, bestRank := 0, -1
	for i := range m.Objects {
		o := &m.Objects[i]
		if o.Module != module || o.Backend != backend {
			continue
		}
		r := rank(o)
		if r < 0 {
			continue
		}
		if o.SourceHash != hash {
			stale++
			continue
		}
		if r > bestRank {
			best, bestRank = o, r
		}
	}
	switch {
	case best != nil:
		return best, ""
	case stale > 0:
		return nil, "the shipped objects are stale: the kernel source changed since they were generated (make kernels)"
	default:
		return nil, "no shipped object for this arch"
	}
}

// ReadObject returns the uncompressed object o from fsys, checked against
// its recorded SHA-256.
func ReadObject(fsys fs.FS, o *ShippedObject) ([]byte, error) {
	f, err := fsys.Open(o.File)
	if err != nil {
		return nil, fmt.Errorf("gpu: kernel object %s: %w", o.File, err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("gpu: kernel object %s: %w", o.File, err)
	}
	buf := bytes.NewBuffer(make([]byte, 0, o.Bytes+bytes.MinRead))
	if _, err := io.Copy(buf, zr); err != nil {
		return nil, fmt.Errorf("gpu: kernel object %s: %w", o.File, err)
	}
	sum := sha256.Sum256(buf.Bytes())
	if hex.EncodeToString(sum[:]) != o.SHA256 {
		return nil, fmt.Errorf("gpu: kernel object %s: SHA-256 differs from the manifest's", o.File)
	}
	return buf.Bytes(), nil
}

// ObjectFile is the file name of a module's object for a target.
func ObjectFile(backend, arch, module string) string {
	return fmt.Sprintf("%s-%s-%s.gz", backend, arch, strings.TrimSuffix(module, ".cu"))
}

// WriteObject compresses code into dir and returns its manifest entry.
func WriteObject(dir, module, backend, arch, kind, hash, compiler string, code []byte) (ShippedObject, error) {
	o := ShippedObject{Module: module, Backend: backend, Arch: arch, Kind: kind,
		File: ObjectFile(backend, arch, module), SourceHash: hash, Options: CompileOptions,
		Compiler: compiler, Bytes: len(code)}
	sum := sha256.Sum256(code)
	o.SHA256 = hex.EncodeToString(sum[:])
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return o, err
	}
	if _, err := zw.Write(code); err != nil {
		return o, err
	}
	if err := zw.Close(); err != nil {
		return o, err
	}
	if err := os.WriteFile(path.Join(dir, o.File), buf.Bytes(), 0o644); err != nil {
		return o, fmt.Errorf("gpu: write kernel object: %w", err)
	}
	return o, nil
}

// Merge replaces m's objects for the same (module, backend, arch) with objs
// and keeps the list sorted, so that regenerating one backend leaves the
// other's entries alone.
func (m *Manifest) Merge(objs []ShippedObject) {
	key := func(o *ShippedObject) string { return o.Backend + "\x00" + o.Arch + "\x00" + o.Module }
	idx := map[string]int{}
	for i := range m.Objects {
		idx[key(&m.Objects[i])] = i
	}
	for _, o := range objs {
		if i, ok := idx[key(&o)]; ok {
			m.Objects[i] = o
		} else {
			idx[key(&o)] = len(m.Objects)
			m.Objects = append(m.Objects, o)
		}
	}
	sort.Slice(m.Objects, func(i, j int) bool { return key(&m.Objects[i]) < key(&m.Objects[j]) })
}

// moduleCode returns the code of module for the worker's device: the
// shipped object when one fits and matches the source, else compiled (or
// read from the kernel cache) by comp(), created on first need, else the
// shipped PTX where the compiler cannot be opened. from says which; why,
// when not shipped, says why not.
//
// driver is the CUDA driver's version (cuDriverGetVersion, 13000 for 13.0;
// 0 if unknown): a cubin or PTX from a newer nvrtc than the driver may not
// load (a newer ELF ABI, a newer PTX ISA), so those objects are skipped.
func moduleCode(man *Manifest, objs fs.FS, module string, dev rocm.DeviceInfo, driver int, comp func() (*rocm.Compiler, error)) (code []byte, from, why string, err error) {
	hash, err := SourceHash(module, CompileOptions)
	if err != nil {
		return nil, "", "", err
	}
	shipped := func(ptx bool) ([]byte, string, string) {
		if man == nil {
			return nil, "", "shipped kernel objects off (" + EnvKernelObjects + "=off)"
		}
		o, why := man.Pick(module, dev.Backend.String(), dev.Arch, hash, ptx)
		if o == nil {
			return nil, "", why
		}
		if need := compilerDriver(o.Compiler); dev.Backend == rocm.CUDA && driver > 0 && driver < need {
			return nil, "", fmt.Sprintf("the driver (%d) is older than the %s that made the shipped objects", driver, o.Compiler)
		}
		code, err := ReadObject(objs, o)
		if err != nil {
			return nil, "", err.Error()
		}
		return code, "shipped " + o.Kind + " " + o.Arch, ""
	}
	code, from, why = shipped(false)
	if code != nil {
		return code, from, "", nil
	}
	code, from, err = compileModule(module, dev, comp)
	if err != nil && errors.Is(err, errNoCompiler) {
		if code, from, _ := shipped(true); code != nil {
			return code, from, fmt.Sprintf("%s; no run-time compiler (%v)", why, err), nil
		}
	}
	return code, from, why, err
}

// errNoCompiler marks compileModule's failure to open nvrtc/hiprtc.
var errNoCompiler = errors.New("no run-time compiler")

// compileModule compiles module through comp() or reads it from the kernel
// cache; from is "compiled" or "kernel cache".
func compileModule(module string, dev rocm.DeviceInfo, comp func() (*rocm.Compiler, error)) (code []byte, from string, err error) {
	c, err := comp()
	if err != nil {
		return nil, "", fmt.Errorf("%w: %w", errNoCompiler, err)
	}
	src, err := Source(module)
	if err != nil {
		return nil, "", err
	}
	code, hit, err := c.Compile(src, module, CompileOptions)
	if err != nil {
		return nil, "", fmt.Errorf("gpu: compile %s for %s: %w", module, dev.Arch, err)
	}
	if hit {
		return code, "kernel cache", nil
	}
	return code, "compiled", nil
}

// compilerDriver is the least CUDA driver version for objects made by
// compiler ("nvrtc 13.0" → 13000); 0 when it names no nvrtc version.
func compilerDriver(compiler string) int {
	v, ok := strings.CutPrefix(compiler, "nvrtc ")
	if !ok {
		return 0
	}
	maj, min, _ := strings.Cut(v, ".")
	a, err1 := strconv.Atoi(maj)
	b, err2 := strconv.Atoi(min)
	if err1 != nil || err2 != nil {
		return 0
	}
	return a*1000 + b*10
}
