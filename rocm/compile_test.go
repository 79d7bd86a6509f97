package rocm

import (
	"bytes"
	_ "embed"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// saxpySource is embedded so the cross-built test binary needs no files
// beside it on the GPU machine.
//
//go:embed testdata/saxpy.cu
var saxpySource string

func testSource(testing.TB) string { return saxpySource }

// hiprtc needs only the library (libamdhip64 in ROCm 5.2, installed by
// .ci/run), not a GPU.
func requireHIPRTC(t *testing.T) {
	t.Helper()
	if _, err := openRTC(HIP); err != nil {
		if errors.Is(err, ErrNoDriver) {
			t.Skipf("hiprtc not installed (CI installs libamdhip64-5 etc.): %v", err)
		}
		t.Fatal(err)
	}
}

// isAMDGPUCode reports whether b is an AMD GPU code object: an ELF with
// e_machine EM_AMDGPU (224), or a clang offload bundle holding one.
func isAMDGPUCode(b []byte) bool {
	if bytes.HasPrefix(b, []byte("__CLANG_OFFLOAD_BUNDLE__")) {
		i := bytes.Index(b, []byte("\x7fELF"))
		return i > 0 && isAMDGPUCode(b[i:])
	}
	return len(b) > 20 && bytes.HasPrefix(b, []byte("\x7fELF")) && b[18] == 224 && b[19] == 0
}

func TestCompileHIP(t *testing.T) {
	requireHIPRTC(t)
	src := testSource(t)
	for _, arch := range []string{"gfx90a", "gfx1030"} {
		t.Run(arch, func(t *testing.T) {
			code, err := CompileHIP(src, "saxpy.cu", arch, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !isAMDGPUCode(code) {
				t.Fatalf("hiprtc output for %s (%d bytes, starts %q) is not an AMDGPU code object", arch, len(code), code[:min(len(code), 32)])
			}
			for _, k := range []string{"saxpy", "affine_u32", "empty"} {
				if !bytes.Contains(code, []byte(k)) {
					t.Errorf("%s code object has no symbol %q", arch, k)
				}
			}
			if !bytes.Contains(code, []byte(arch)) {
				t.Errorf("code object does not name its target %s", arch)
			}
			t.Logf("%s: %d bytes", arch, len(code))
		})
	}
}

//go:embed testdata/math.hip
var mathHIPSource string

func TestCompileHIPMath(t *testing.T) {
	requireHIPRTC(t)
	for _, arch := range []string{"gfx90a", "gfx1030"} {
		code, err := CompileHIP(mathHIPSource, "math.hip", arch, []string{"-O3"})
		if err != nil {
			t.Fatalf("%s: %v", arch, err)
		}
		if !isAMDGPUCode(code) || !bytes.Contains(code, []byte("softplus_warpsum")) {
			t.Fatalf("%s: bad code object (%d bytes)", arch, len(code))
		}
	}
}

func TestCompileHIPError(t *testing.T) {
	requireHIPRTC(t)
	_, err := CompileHIP(`extern "C" __global__ void broken(int* p) { p[0] = undeclared_name; }`, "broken.cu", "gfx90a", nil)
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("want *Error, got %v", err)
	}
	if !strings.HasPrefix(e.Call, "hiprtc") || !strings.Contains(e.Log, "undeclared_name") {
		t.Fatalf("error should name the hiprtc call and carry the compiler log: %v", err)
	}
}

// The cache: the first Compiler compiles, a second one over the same folder
// (as a second process would) hits and returns the same bytes; a changed
// option or corrupted file misses.
func TestCompilerCacheHIP(t *testing.T) {
	requireHIPRTC(t)
	dir := t.TempDir()
	src := testSource(t)
	c1, err := NewCompiler(HIP, "gfx90a", dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	code1, hit, err := c1.Compile(src, "saxpy.cu", nil)
	if err != nil || hit {
		t.Fatalf("first compile: hit=%v err=%v", hit, err)
	}
	c2, _ := NewCompiler(HIP, "gfx90a", dir, 0)
	code2, hit, err := c2.Compile(src, "saxpy.cu", nil)
	if err != nil || !hit || !bytes.Equal(code1, code2) {
		t.Fatalf("second compile: hit=%v err=%v same=%v", hit, err, bytes.Equal(code1, code2))
	}
	if _, hit, _ := c2.Compile(src, "saxpy.cu", []string{"-DX=1"}); hit {
		t.Fatal("different options must not hit")
	}
	c3, _ := NewCompiler(HIP, "gfx90a", dir, 1)
	if c3.Key(src, "saxpy.cu", nil) == c2.Key(src, "saxpy.cu", nil) {
		t.Fatal("driver version must be part of the key")
	}
	p := c2.path(c2.Key(src, "saxpy.cu", nil))
	b, _ := os.ReadFile(p)
	b[len(b)-1] ^= 0xff
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	code4, hit, err := c2.Compile(src, "saxpy.cu", nil)
	if err != nil || hit || !bytes.Equal(code4, code1) {
		t.Fatalf("corrupted cache file: hit=%v err=%v", hit, err)
	}
	if h, m := c2.Stats(); h != 1 || m != 2 {
		t.Fatalf("stats: %d hits %d misses, want 1 and 2", h, m)
	}
}

// With the HIP library present but no AMD GPU (CI), Open must fail with an
// error matching ErrNoDevice that names the library it loaded.
func TestHIPNoDevice(t *testing.T) {
	rt, err := Open(HIP)
	if errors.Is(err, ErrNoDriver) {
		t.Skipf("libamdhip64 not installed: %v", err)
	}
	if err == nil {
		n, _ := rt.DeviceCount()
		t.Skipf("a HIP device is present (%d): the no-device path is not testable here", n)
	}
	if !errors.Is(err, ErrNoDevice) {
		t.Fatalf("want ErrNoDevice, got %v", err)
	}
	if !strings.Contains(err.Error(), "libamdhip64") {
		t.Fatalf("error should name the library: %v", err)
	}
	t.Logf("HIP without a device: %v", err)
}

func TestNoDriverNamesWhatWasLookedFor(t *testing.T) {
	t.Setenv(EnvCUDALib, "/nonexistent/libcuda.so.1")
	// Bypass the per-process cache: openLibrary is what Open uses.
	_, err := openLibrary(EnvCUDALib, "libcuda.so.1")
	if !errors.Is(err, ErrNoDriver) {
		t.Fatalf("want ErrNoDriver, got %v", err)
	}
	if !strings.Contains(err.Error(), "/nonexistent/libcuda.so.1") {
		t.Fatalf("error should name the path tried: %v", err)
	}
	t.Setenv(EnvCUDALib, "")
	_, err = openLibrary("", "libforge-does-not-exist.so.1")
	if !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), "libforge-does-not-exist.so.1") || !strings.Contains(err.Error(), "/usr/lib/x86_64-linux-gnu") {
		t.Fatalf("error should list the name and folders searched: %v", err)
	}
}

// TestROCmSonames checks the HIP runtime and hiprtc are looked for under
// the sonames of ROCm 5, 6 and 7, and that an install holding only a
// versioned file (no development symlink) is found in a library folder.
func TestROCmSonames(t *testing.T) {
	for _, v := range []string{"5", "6", "7"} {
		if !slices.Contains(hipLibNames, "libamdhip64.so."+v) {
			t.Errorf("libamdhip64.so.%s is not among %v", v, hipLibNames)
		}
		if v != "5" && !slices.Contains(hiprtcLibNames, "libhiprtc.so."+v) {
			t.Errorf("libhiprtc.so.%s is not among %v", v, hiprtcLibNames)
		}
	}
	// A folder with only "libhiprtc.so.7" (here a link to the C library,
	// which loads anywhere) stands for a runtime-only ROCm 7 install.
	libc := ""
	for _, p := range []string{"/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6", "/lib64/libc.so.6"} {
		if _, err := os.Stat(p); err == nil {
			libc = p
			break
		}
	}
	if libc == "" {
		t.Fatal("no C library found to stand in for a ROCm library")
	}
	dir := t.TempDir()
	if err := os.Symlink(libc, filepath.Join(dir, "libhiprtc.so.7")); err != nil {
		t.Fatal(err)
	}
	saveDirs, saveGlobs := libDirs, libGlobs
	t.Cleanup(func() { libDirs, libGlobs = saveDirs, saveGlobs })
	libDirs, libGlobs = []string{dir}, nil
	l, err := openLibrary("", "libhiprtc-forge-absent.so", "libhiprtc.so.7")
	if err != nil {
		t.Fatalf("versioned-only install not found: %v", err)
	}
	if l.path != filepath.Join(dir, "libhiprtc.so.7") && l.path != "libhiprtc.so.7" {
		t.Errorf("opened %s", l.path)
	}
}
