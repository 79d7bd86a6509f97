package gpu

import (
	"bytes"
	"debug/elf"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forge-llm/forge/rocm"
)

// shippedTargets are the targets every module must ship an object for.
var shippedTargets = []struct{ backend, arch, kind string }{
	{"cuda", "sm_80", "cubin"}, {"cuda", "sm_86", "cubin"}, {"cuda", "sm_89", "cubin"}, {"cuda", "sm_90", "cubin"},
	{"cuda", "compute_80", "ptx"},
	{"hip", "gfx90a", "hsaco"}, {"hip", "gfx908", "hsaco"}, {"hip", "gfx1030", "hsaco"},
}

func embeddedObjects(t *testing.T) (fs.FS, *Manifest) {
	t.Helper()
	objs, err := fs.Sub(shippedFS, "obj")
	if err != nil {
		t.Fatal(err)
	}
	man, err := ReadManifest(objs)
	if err != nil {
		t.Fatal(err)
	}
	return objs, man
}

// TestShippedObjectsMatchSources is the CI check that the objects embedded
// in the binary were made from the current kernel sources and options: a
// change to a .cu or .h file without `make kernels` fails here. It also
// checks every module has an object for every shipped target, each object
// decompresses to its recorded SHA-256, and obj/ holds no stray file.
func TestShippedObjectsMatchSources(t *testing.T) {
	objs, man := embeddedObjects(t)
	listed := map[string]bool{ManifestFile: true}
	for _, m := range Modules() {
		hash, err := SourceHash(m, CompileOptions)
		if err != nil {
			t.Fatal(err)
		}
		for _, tg := range shippedTargets {
			var found []*ShippedObject
			for i := range man.Objects {
				o := &man.Objects[i]
				if o.Module == m && o.Backend == tg.backend && o.Arch == tg.arch {
					found = append(found, o)
				}
			}
			if len(found) != 1 {
				t.Errorf("%s: %d objects for %s %s, want 1 (run make kernels)", m, len(found), tg.backend, tg.arch)
				continue
			}
			o := found[0]
			listed[o.File] = true
			if o.Kind != tg.kind {
				t.Errorf("%s %s: kind %q, want %q", m, tg.arch, o.Kind, tg.kind)
			}
			if o.SourceHash != hash {
				t.Errorf("%s %s %s: made from another source (hash %.12s, source now %.12s): the kernel source changed; regenerate the objects (make kernels, see bench/kernels-gen.sh)", m, tg.backend, tg.arch, o.SourceHash, hash)
			}
			if strings.Join(o.Options, " ") != strings.Join(CompileOptions, " ") {
				t.Errorf("%s %s: options %q, want %q", m, tg.arch, o.Options, CompileOptions)
			}
			code, err := ReadObject(objs, o)
			if err != nil {
				t.Error(err)
			} else if len(code) != o.Bytes {
				t.Errorf("%s: %d bytes, manifest says %d", o.File, len(code), o.Bytes)
			}
		}
	}
	ents, err := fs.ReadDir(objs, ".")
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, e := range ents {
		if !listed[e.Name()] {
			t.Errorf("obj/%s is not in the manifest", e.Name())
		}
		if info, err := e.Info(); err == nil {
			total += info.Size()
		}
	}
	if total > 15<<20 {
		t.Errorf("shipped objects take %d bytes, over the 15 MiB budget", total)
	}
	t.Logf("%d objects, %d bytes compressed", len(man.Objects), total)
}

// elfSymbols is the set of names in f's symbol tables.
func elfSymbols(f *elf.File) map[string]bool {
	names := map[string]bool{}
	for _, get := range []func() ([]elf.Symbol, error){f.Symbols, f.DynamicSymbols} {
		syms, _ := get()
		for _, s := range syms {
			names[s.Name] = true
		}
	}
	return names
}

// TestShippedHIPObjectsAreCodeObjects parses every shipped AMD object as an
// ELF code object for its gfx target: AMDGPU machine, HSA OS ABI, the
// target's EF_AMDGPU_MACH in e_flags, and every kernel of the module in its
// symbol table. Loading them through hipModuleLoadData needs a device (ROCm
// 5.2's runtime has no way to load a module without one), so on the GPU-less
// CI this structural check is what runs; on an AMD GPU, New loads them.
func TestShippedHIPObjectsAreCodeObjects(t *testing.T) {
	mach := map[string]uint32{"gfx908": 0x30, "gfx90a": 0x3f, "gfx1030": 0x36} // EF_AMDGPU_MACH_AMDGCN_*
	objs, man := embeddedObjects(t)
	n := 0
	for i := range man.Objects {
		o := &man.Objects[i]
		if o.Backend != "hip" {
			continue
		}
		n++
		code, err := ReadObject(objs, o)
		if err != nil {
			t.Fatal(err)
		}
		f, err := elf.NewFile(bytes.NewReader(code))
		if err != nil {
			t.Fatalf("%s: not an ELF code object: %v", o.File, err)
		}
		if f.Class != elf.ELFCLASS64 || f.Machine != elf.EM_AMDGPU || f.OSABI != 64 /* ELFOSABI_AMDGPU_HSA */ {
			t.Errorf("%s: class %v machine %v OS ABI %d, want ELF64 AMDGPU HSA", o.File, f.Class, f.Machine, f.OSABI)
		}
		want, ok := mach[o.Arch]
		if !ok {
			t.Errorf("%s: no e_flags machine known for %s", o.File, o.Arch)
		}
		if got := elfFlags(code) & 0xff; got != want {
			t.Errorf("%s: e_flags machine %#x, want %#x (%s)", o.File, got, want, o.Arch)
		}
		src, err := Source(o.Module)
		if err != nil {
			t.Fatal(err)
		}
		syms := elfSymbols(f)
		for _, k := range kernelNames(t, o.Module, src) {
			if !syms[k] || !syms[k+".kd"] {
				t.Errorf("%s: kernel %s or its descriptor missing from the symbol table", o.File, k)
			}
		}
	}
	if n == 0 {
		t.Fatal("no HIP objects shipped")
	}
}

// elfFlags reads e_flags of a 64-bit little-endian ELF header.
func elfFlags(b []byte) uint32 {
	return uint32(b[48]) | uint32(b[49])<<8 | uint32(b[50])<<16 | uint32(b[51])<<24
}

// TestShippedCUDAObjects checks the cubins are CUDA ELF files for their SM
// (e_flags bits 8–15 in the CUDA 13 ELF ABI, OS ABI 0x41) defining every
// kernel, and the PTX is NUL-terminated text for its virtual target with an
// entry per kernel: what cuModuleLoadData accepts.
func TestShippedCUDAObjects(t *testing.T) {
	objs, man := embeddedObjects(t)
	for i := range man.Objects {
		o := &man.Objects[i]
		if o.Backend != "cuda" {
			continue
		}
		code, err := ReadObject(objs, o)
		if err != nil {
			t.Fatal(err)
		}
		src, err := Source(o.Module)
		if err != nil {
			t.Fatal(err)
		}
		sm := archNumber(o.Arch)
		switch o.Kind {
		case "cubin":
			f, err := elf.NewFile(bytes.NewReader(code))
			if err != nil {
				t.Fatalf("%s: not a cubin: %v", o.File, err)
			}
			if f.Machine != elf.EM_CUDA {
				t.Errorf("%s: machine %v, want EM_CUDA", o.File, f.Machine)
			}
			if got := int(elfFlags(code)>>8) & 0xff; f.OSABI == 0x41 && got != sm {
				t.Errorf("%s: e_flags SM %d, want %d", o.File, got, sm)
			}
			syms := elfSymbols(f)
			for _, k := range kernelNames(t, o.Module, src) {
				if !syms[k] {
					t.Errorf("%s: no kernel %s", o.File, k)
				}
			}
		case "ptx":
			text := string(code)
			if !strings.HasSuffix(text, "\x00") {
				t.Errorf("%s: PTX not NUL-terminated", o.File)
			}
			if !strings.Contains(text, ".target sm_"+strings.TrimPrefix(o.Arch, "compute_")+"\n") {
				t.Errorf("%s: PTX not for %s", o.File, o.Arch)
			}
			for _, k := range kernelNames(t, o.Module, src) {
				if !strings.Contains(text, ".entry "+k+"(") {
					t.Errorf("%s: no entry %s", o.File, k)
				}
			}
		default:
			t.Errorf("%s: kind %q", o.File, o.Kind)
		}
	}
}

func TestPick(t *testing.T) {
	const h = "hash"
	obj := func(backend, arch, kind, hash string) ShippedObject {
		return ShippedObject{Module: "m.cu", Backend: backend, Arch: arch, Kind: kind, SourceHash: hash, File: arch}
	}
	man := &Manifest{Version: 1, Objects: []ShippedObject{
		obj("cuda", "sm_80", "cubin", h), obj("cuda", "sm_90", "cubin", h), obj("cuda", "compute_80", "ptx", h),
		obj("cuda", "sm_89", "cubin", "old"), obj("hip", "gfx90a", "hsaco", h), obj("hip", "gfx1030", "hsaco", "old"),
	}}
	for _, c := range []struct {
		backend, arch string
		ptx           bool
		want, why     string
	}{
		{"cuda", "sm_90", false, "sm_90", ""},
		{"cuda", "sm_86", false, "sm_80", ""}, // same major: binary compatible
		{"cuda", "sm_89", false, "sm_80", ""}, // the sm_89 cubin is stale
		{"cuda", "sm_100", false, "", "no shipped object"},
		{"cuda", "sm_100", true, "compute_80", ""},
		{"cuda", "sm_120", true, "compute_80", ""},
		{"cuda", "sm_75", true, "", "no shipped object"},
		{"hip", "gfx90a:sramecc+:xnack-", false, "gfx90a", ""},
		{"hip", "gfx1030", false, "", "stale"},
		{"hip", "gfx1100", false, "", "no shipped object"},
	} {
		o, why := man.Pick("m.cu", c.backend, c.arch, h, c.ptx)
		got := ""
		if o != nil {
			got = o.Arch
		}
		if got != c.want || (c.why != "" && !strings.Contains(why, c.why)) {
			t.Errorf("Pick(%s %s ptx=%v) = %q, %q; want %q, %q", c.backend, c.arch, c.ptx, got, why, c.want, c.why)
		}
	}
	if o, _ := man.Pick("other.cu", "cuda", "sm_90", h, true); o != nil {
		t.Errorf("Pick of another module returned %s", o.File)
	}
}

func TestWriteReadMergeObjects(t *testing.T) {
	dir := t.TempDir()
	code := bytes.Repeat([]byte("kernel code "), 1000)
	o, err := WriteObject(dir, "m.cu", "hip", "gfx90a", "hsaco", "h1", "hiprtc test", code)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ReadObject(os.DirFS(dir), &o)
	if err != nil || !bytes.Equal(got, code) {
		t.Fatalf("read back %d bytes, err %v; want the %d written", len(got), err, len(code))
	}
	bad := o
	bad.SHA256 = strings.Repeat("0", 64)
	if _, err := ReadObject(os.DirFS(dir), &bad); err == nil {
		t.Error("an object with a wrong SHA-256 was read without error")
	}
	if err := os.WriteFile(filepath.Join(dir, o.File), []byte("not gzip"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadObject(os.DirFS(dir), &o); err == nil {
		t.Error("a corrupt object was read without error")
	}
	man := &Manifest{Version: 1}
	o2 := o
	o2.Arch, o2.File = "gfx1030", "x"
	man.Merge([]ShippedObject{o, o2})
	o.SourceHash = "h2"
	man.Merge([]ShippedObject{o})
	if len(man.Objects) != 2 || man.Objects[0].Arch != "gfx1030" || man.Objects[1].SourceHash != "h2" {
		t.Errorf("merged manifest %+v", man.Objects)
	}
}

// TestModuleCodeChoosesShipped runs New's choice of code without a GPU:
// the shipped cubin for an H100 with no compiler opened; for a device with
// no cubin, the run-time compiler first and the PTX only when there is
// none; an error when neither.
func TestModuleCodeChoosesShipped(t *testing.T) {
	objs, man := embeddedObjects(t)
	noComp := func() (*rocm.Compiler, error) { return nil, rocm.ErrNoDriver }
	called := false
	mustNotCompile := func() (*rocm.Compiler, error) { called = true; return nil, errors.New("compiler opened") }
	for _, m := range Modules() {
		code, from, why, err := moduleCode(man, objs, m, rocm.DeviceInfo{Backend: rocm.CUDA, Arch: "sm_90"}, 13000, mustNotCompile)
		if err != nil || from != "shipped cubin sm_90" || why != "" || len(code) == 0 || called {
			t.Fatalf("%s on sm_90: from %q why %q err %v compiler opened %v", m, from, why, err, called)
		}
		code, from, _, err = moduleCode(man, objs, m, rocm.DeviceInfo{Backend: rocm.HIP, Arch: "gfx90a:sramecc+:xnack-"}, 50221, mustNotCompile)
		if err != nil || from != "shipped hsaco gfx90a" || len(code) == 0 || called {
			t.Fatalf("%s on gfx90a: from %q err %v", m, from, err)
		}
		code, from, why, err = moduleCode(man, objs, m, rocm.DeviceInfo{Backend: rocm.CUDA, Arch: "sm_100"}, 13000, noComp)
		if err != nil || from != "shipped ptx compute_80" || !strings.Contains(why, "no run-time compiler") || !bytes.HasSuffix(code, []byte{0}) {
			t.Fatalf("%s on sm_100 with no nvrtc: from %q why %q err %v", m, from, why, err)
		}
		if _, _, why, err = moduleCode(man, objs, m, rocm.DeviceInfo{Backend: rocm.CUDA, Arch: "sm_75"}, 13000, noComp); !errors.Is(err, rocm.ErrNoDriver) || !strings.Contains(why, "no shipped object") {
			t.Fatalf("%s on sm_75 with no nvrtc: why %q err %v, want ErrNoDriver", m, why, err)
		}
		// A CUDA 12.4 driver cannot be trusted with nvrtc 13.0's objects:
		// the run-time compiler is asked for instead.
		if _, _, why, err = moduleCode(man, objs, m, rocm.DeviceInfo{Backend: rocm.CUDA, Arch: "sm_90"}, 12040, noComp); !errors.Is(err, rocm.ErrNoDriver) || !strings.Contains(why, "older than the nvrtc 13.0") {
			t.Fatalf("%s on a 12.4 driver: why %q err %v", m, why, err)
		}
		if _, _, why, _ = moduleCode(nil, nil, m, rocm.DeviceInfo{Backend: rocm.CUDA, Arch: "sm_90"}, 13000, noComp); !strings.Contains(why, EnvKernelObjects) {
			t.Fatalf("%s with objects off: why %q", m, why)
		}
	}
}

func TestCompilerDriver(t *testing.T) {
	for in, want := range map[string]int{"nvrtc 13.0": 13000, "nvrtc 12.4": 12040, "hiprtc 9.0": 0, "nvrtc x": 0} {
		if got := compilerDriver(in); got != want {
			t.Errorf("compilerDriver(%q) = %d, want %d", in, got, want)
		}
	}
}

func TestShippedObjectsEnv(t *testing.T) {
	t.Setenv(EnvKernelObjects, "off")
	if f, err := ShippedObjects(); f != nil || err != nil {
		t.Fatalf("off: %v %v", f, err)
	}
	dir := t.TempDir()
	t.Setenv(EnvKernelObjects, dir)
	f, err := ShippedObjects()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ReadManifest(f); err == nil {
		t.Error("an empty folder read as a manifest")
	}
	t.Setenv(EnvKernelObjects, "")
	f, err = ShippedObjects()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ReadManifest(f); err != nil {
		t.Error(err)
	}
}
