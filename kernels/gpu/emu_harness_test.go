package gpu

// The harness of the wavefront emulator test (emu_test.go): it finds the
// clang that Debian's hipcc brings, builds emu/driver.cpp with every kernel
// module (gpu.Source, unmodified) once per wave width, and runs jobs of
// kernel launches through it. See emu/wave.h for what the emulator models
// and what it cannot check.

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/forge-llm/forge/rocm"
)

// emuClang returns the clang++ to build the emulator with: $FORGE_EMU_CLANG,
// else the newest /usr/lib/llvm-*/bin/clang++ (the one Debian's hipcc
// runs), else clang++ on the PATH; "" if none.
func emuClang() string {
	if c := os.Getenv("FORGE_EMU_CLANG"); c != "" {
		return c
	}
	m, _ := filepath.Glob("/usr/lib/llvm-*/bin/clang++")
	sort.Slice(m, func(i, j int) bool { return llvmVersion(m[i]) > llvmVersion(m[j]) })
	if len(m) > 0 {
		return m[0]
	}
	if p, err := exec.LookPath("clang++"); err == nil {
		return p
	}
	return ""
}

func llvmVersion(p string) int {
	var v int
	fmt.Sscanf(strings.TrimPrefix(filepath.Base(filepath.Dir(filepath.Dir(p))), "llvm-"), "%d", &v)
	return v
}

// The emulator's files, embedded so that the test binary builds it from
// any working directory.
var (
	//go:embed emu/wave.h
	emuWave string
	//go:embed emu/driver.cpp
	emuDriverSrc string
	//go:embed emu/selftest.cu
	emuSelftest string
)

var emuKernelRE = regexp.MustCompile(`extern\s+"C"\s+void\s+(\w+)\s*\(`)

var emuFlags = []string{"-std=c++17", "-O1", "-fno-strict-aliasing", "-w"}

type emuBuild struct {
	once sync.Once
	path string
	err  error
}

var emuBuilds = map[int]*emuBuild{32: {}, 64: {}}

// emuDriver returns the emulator binary for warp size warp, building it on
// first use (into the user cache, keyed by the hash of every input, so a
// second run reuses it). It skips the test where no clang is found.
func emuDriver(t *testing.T, warp int) string {
	t.Helper()
	clang := emuClang()
	if clang == "" {
		t.Skip("wavefront emulator: no clang++ found (install Debian's hipcc, which brings clang, or set FORGE_EMU_CLANG)")
	}
	b := emuBuilds[warp]
	b.once.Do(func() { b.path, b.err = buildEmu(clang, warp) })
	if b.err != nil {
		t.Fatalf("wavefront emulator (warp %d): %v", warp, b.err)
	}
	return b.path
}

func buildEmu(clang string, warp int) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%v\x00%d\x00", clang, emuFlags, warp)
	h.Write([]byte(emuWave))
	h.Write([]byte(emuDriverSrc))
	srcs := map[string]string{}
	for _, m := range Modules() {
		s, err := Source(m)
		if err != nil {
			return "", err
		}
		srcs[m] = s
		fmt.Fprintf(h, "\x00%s\x00%s", m, s)
	}
	// the emulator's own test kernels, after common.h
	common, err := sources.ReadFile("cu/common.h")
	if err != nil {
		return "", err
	}
	srcs["emu_selftest.cu"] = strings.ReplaceAll(string(common), "#pragma once\n", "") + emuSelftest
	fmt.Fprintf(h, "\x00%s", srcs["emu_selftest.cu"])
	key := hex.EncodeToString(h.Sum(nil))[:20]
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "forge-wave-emu", key)
	bin := filepath.Join(dir, fmt.Sprintf("driver%d", warp))
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, "build")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	emuDir := filepath.Join(tmp, "emu")
	if err := os.Mkdir(emuDir, 0o755); err != nil {
		return "", err
	}
	for name, text := range map[string]string{"wave.h": emuWave, "driver.cpp": emuDriverSrc} {
		if err := os.WriteFile(filepath.Join(emuDir, name), []byte(text), 0o644); err != nil {
			return "", err
		}
	}
	flags := append(append([]string{}, emuFlags...), fmt.Sprintf("-DWARP=%d", warp), "-I"+emuDir)
	// Two compilers at a time: the modules take seconds each.
	var wg sync.WaitGroup
	sem := make(chan struct{}, 2)
	errs := make([]error, len(srcs))
	var objs []string
	i := 0
	for m, s := range srcs {
		obj := filepath.Join(tmp, strings.TrimSuffix(m, ".cu")+".o")
		objs = append(objs, obj)
		wg.Add(1)
		go func(i int, m, s, obj string) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = buildEmuModule(clang, flags, tmp, m, s, obj)
		}(i, m, s, obj)
		i++
	}
	wg.Wait()
	for _, e := range errs {
		if e != nil {
			return "", e
		}
	}
	out := filepath.Join(tmp, "driver")
	args := append(append(append([]string{}, flags...), filepath.Join(emuDir, "driver.cpp")), objs...)
	if err := runClang(clang, append(args, "-o", out)...); err != nil {
		return "", fmt.Errorf("link: %w", err)
	}
	if err := os.Rename(out, bin); err != nil {
		return "", err
	}
	return bin, nil
}

// buildEmuModule compiles one kernel module: wave.h, the module's source,
// then an EMU_KERNEL registration for every extern "C" kernel in it (the
// names are read from the preprocessed text, where the macros that stamp
// out kernels per type have been expanded).
func buildEmuModule(clang string, flags []string, dir, module, src, obj string) error {
	cpp := filepath.Join(dir, strings.TrimSuffix(module, ".cu")+".cpp")
	text := "#include \"wave.h\"\n" + src + "\n"
	if err := os.WriteFile(cpp, []byte(text), 0o644); err != nil {
		return err
	}
	pre, err := exec.Command(clang, append(append([]string{}, flags...), "-E", "-P", cpp)...).Output()
	if err != nil {
		return fmt.Errorf("preprocess %s: %w", module, err)
	}
	var reg strings.Builder
	reg.WriteString(text)
	seen := map[string]bool{}
	for _, m := range emuKernelRE.FindAllSubmatch(pre, -1) {
		if name := string(m[1]); !seen[name] {
			seen[name] = true
			fmt.Fprintf(&reg, "EMU_KERNEL(%s)\n", name)
		}
	}
	if len(seen) == 0 {
		return fmt.Errorf("module %s: no kernels found", module)
	}
	if err := os.WriteFile(cpp, []byte(reg.String()), 0o644); err != nil {
		return err
	}
	if err := runClang(clang, append(append([]string{}, flags...), "-c", cpp, "-o", obj)...); err != nil {
		return fmt.Errorf("compile %s: %w", module, err)
	}
	return nil
}

func runClang(clang string, args ...string) error {
	cmd := exec.Command(clang, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		msg := stderr.String()
		if len(msg) > 4000 {
			msg = msg[:4000] + "…"
		}
		return fmt.Errorf("%s: %w\n%s", clang, err, msg)
	}
	return nil
}

// emuJob is a list of buffers and the kernel launches that use them.
type emuJob struct {
	bufs     [][]byte
	launches []emuLaunch
}

type emuLaunch struct {
	name        string
	grid, block rocm.Dim3
	args        []emuArg
}

// emuArg is one kernel argument: a buffer (at a byte offset), a null
// pointer, an int32 or a float32.
type emuArg struct {
	kind byte
	buf  int
	off  int
	i    int32
	f    float32
}

func eP(buf, off int) emuArg { return emuArg{kind: 'p', buf: buf, off: off} }
func eNull() emuArg          { return emuArg{kind: 'n'} }
func eI(v int) emuArg        { return emuArg{kind: 'i', i: int32(v)} }
func eF(v float32) emuArg    { return emuArg{kind: 'f', f: v} }

func (j *emuJob) bytes(b []byte) int {
	j.bufs = append(j.bufs, append([]byte(nil), b...))
	return len(j.bufs) - 1
}

func (j *emuJob) f32(v []float32) int {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return j.bytes(b)
}

func (j *emuJob) i32(v []int32) int {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return j.bytes(b)
}

// zeros adds a buffer of n zero bytes, poisoned with NaN-like 0xFF bytes
// instead when poison is set (outputs a kernel must write entirely).
func (j *emuJob) zeros(n int, poison bool) int {
	b := make([]byte, n)
	if poison {
		for i := range b {
			b[i] = 0xFF
		}
	}
	j.bufs = append(j.bufs, b)
	return len(j.bufs) - 1
}

func (j *emuJob) launch(name string, grid, block rocm.Dim3, args ...emuArg) {
	j.launches = append(j.launches, emuLaunch{name, grid, block, args})
}

// emuResult is the buffers after the job and, per launch, the count of
// shuffle reads from inactive lanes.
type emuResult struct {
	bufs   [][]byte
	poison []uint64
}

func (r *emuResult) f32(i int) []float32 {
	b := r.bufs[i]
	v := make([]float32, len(b)/4)
	for k := range v {
		v[k] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*k:]))
	}
	return v
}

func (r *emuResult) i32(i int) []int32 {
	b := r.bufs[i]
	v := make([]int32, len(b)/4)
	for k := range v {
		v[k] = int32(binary.LittleEndian.Uint32(b[4*k:]))
	}
	return v
}

// runEmu runs job on the emulator of the given warp size and fails the
// test on any shuffle read from an inactive lane.
func runEmu(t *testing.T, warp int, job *emuJob) *emuResult {
	t.Helper()
	return runEmuPoison(t, warp, job, false)
}

// runEmuPoison is runEmu; with allowPoison the reads from inactive lanes
// are only counted (the emulator's own test).
func runEmuPoison(t *testing.T, warp int, job *emuJob, allowPoison bool) *emuResult {
	t.Helper()
	drv := emuDriver(t, warp)
	var b bytes.Buffer
	w := func(v any) { binary.Write(&b, binary.LittleEndian, v) }
	b.WriteString("WEMU")
	w(uint32(len(job.bufs)))
	for _, buf := range job.bufs {
		w(uint64(len(buf)))
		b.Write(buf)
	}
	w(uint32(len(job.launches)))
	for _, l := range job.launches {
		w(uint32(len(l.name)))
		b.WriteString(l.name)
		for _, d := range []rocm.Dim3{l.grid, l.block} {
			z := d.Z
			if z == 0 {
				z = 1
			}
			y := d.Y
			if y == 0 {
				y = 1
			}
			w([3]uint32{d.X, y, z})
		}
		w(uint32(len(l.args)))
		for _, a := range l.args {
			b.WriteByte(a.kind)
			switch a.kind {
			case 'p':
				w(uint32(a.buf))
				w(uint64(a.off))
			case 'i':
				w(a.i)
			case 'f':
				w(a.f)
			}
		}
	}
	dir := t.TempDir()
	in, out := filepath.Join(dir, "job"), filepath.Join(dir, "out")
	if err := os.WriteFile(in, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(drv, in, out)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		var names []string
		for _, l := range job.launches {
			names = append(names, l.name)
		}
		t.Fatalf("emulator (warp %d) on %v: %v\n%s", warp, names, err, stderr.String())
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	res := &emuResult{}
	for _, buf := range job.bufs {
		res.bufs = append(res.bufs, raw[:len(buf)])
		raw = raw[len(buf):]
	}
	for i, l := range job.launches {
		p := binary.LittleEndian.Uint64(raw[8*i:])
		res.poison = append(res.poison, p)
		if p != 0 && !allowPoison {
			t.Errorf("warp %d: %s grid %v block %v: %d shuffle reads from inactive lanes", warp, l.name, l.grid, l.block, p)
		}
	}
	return res
}
