package gpu

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The checks of the shipped AMD code objects' contents: what AMD's compiler
// made of the kernels, read with the LLVM tools of Debian's llvm-15 (CI
// installs it, .ci/run). No AMD GPU runs them here; these say what the
// instructions and resources are, not that they compute the right thing
// (the wavefront emulator tests check the source's semantics).

// llvmTool finds an LLVM 15 tool: Debian's /usr/lib/llvm-15/bin, then
// name-15 and name on PATH.
func llvmTool(t *testing.T, name string) string {
	t.Helper()
	for _, p := range []string{"/usr/lib/llvm-15/bin/" + name, name + "-15", name} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	t.Skipf("%s (LLVM 15) not found: install Debian's llvm-15 (apt-get install llvm-15) to check the HIP code objects", name)
	return ""
}

// hipCodeArchs are the targets whose objects the checks read: CDNA2
// (wave64) and RDNA2 (wave32), as issue 27 asks.
var hipCodeArchs = []string{"gfx90a", "gfx1030"}

// shippedHIPFile writes the shipped object of module for arch to a file
// for the LLVM tools.
func shippedHIPFile(t *testing.T, module, arch string) string {
	t.Helper()
	objs, man := embeddedObjects(t)
	for i := range man.Objects {
		o := &man.Objects[i]
		if o.Module != module || o.Backend != "hip" || o.Arch != arch {
			continue
		}
		code, err := ReadObject(objs, o)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(t.TempDir(), fmt.Sprintf("%s-%s.o", arch, module))
		if err := os.WriteFile(p, code, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Fatalf("no shipped HIP object of %s for %s", module, arch)
	return ""
}

// kernelResources is what the AMDGPU metadata note says of one kernel.
type kernelResources struct {
	Scratch  int // .private_segment_fixed_size: bytes per lane
	VGPRs    int
	MaxGroup int // .max_flat_workgroup_size: from __launch_bounds__, else 1024
}

// parseKernelNotes reads the per-kernel entries of `llvm-readelf --notes`
// output (the amdhsa.kernels YAML list).
func parseKernelNotes(out []byte) (map[string]kernelResources, error) {
	res := map[string]kernelResources{}
	var name string
	var cur kernelResources
	flush := func() {
		if name != "" {
			res[name] = cur
		}
		name, cur = "", kernelResources{Scratch: -1, VGPRs: -1, MaxGroup: -1}
	}
	flush()
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "  - .") || strings.HasPrefix(line, "amdhsa.") {
			flush() // a new kernel entry, or the end of the list
		}
		f := strings.Fields(line)
		if len(f) != 2 || !strings.HasPrefix(line, "    .") && !strings.HasPrefix(line, "  - .") {
			continue
		}
		var dst *int
		switch f[0] {
		case ".name:":
			name = f[1]
			continue
		case ".private_segment_fixed_size:":
			dst = &cur.Scratch
		case ".vgpr_count:":
			dst = &cur.VGPRs
		case ".max_flat_workgroup_size:":
			dst = &cur.MaxGroup
		default:
			continue
		}
		v, err := strconv.Atoi(f[1])
		if err != nil {
			return nil, fmt.Errorf("notes: %q: %w", line, err)
		}
		*dst = v
	}
	flush()
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return res, nil
}

// TestHIPCodeNoScratch: no kernel the decode step runs (matrix–vector,
// 8-bit-activation batch products, mmq, attention, norms and the other
// ops, dequantization, prompt attention) uses scratch memory on gfx90a or
// gfx1030 (.private_segment_fixed_size 0: no register spills, no stack
// arrays, no calls), and each was compiled for the workgroup size the
// runtime launches it with (__launch_bounds__, without which HIP assumes
// 1024 threads and caps the registers). gemm.cu, the prompt GEMM, is
// reported but not held to it (its FMA fallback keeps 32 bytes of dead
// stores of zeros in scratch on both targets).
// oneRowKernels are the kernels launched with 1024-thread blocks on
// purpose (rmsnorm_row's block, one row of the decode shape).
var oneRowKernels = map[string]bool{"rmsnorm_row": true, "rmsnorm_row2": true, "mix_add_rmsnorm_row": true,
	"qkv_prep_f16": true, "qkv_prep_f32": true}

func TestHIPCodeNoScratch(t *testing.T) {
	readelf := llvmTool(t, "llvm-readelf")
	for _, arch := range hipCodeArchs {
		for _, m := range Modules() {
			out, err := exec.Command(readelf, "--notes", shippedHIPFile(t, m, arch)).Output()
			if err != nil {
				t.Fatalf("%s --notes %s %s: %v", readelf, arch, m, err)
			}
			res, err := parseKernelNotes(out)
			if err != nil {
				t.Fatalf("%s %s: %v", arch, m, err)
			}
			src, err := Source(m)
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range kernelNames(t, m, src) {
				r, ok := res[k]
				if !ok {
					t.Errorf("%s %s: no metadata for kernel %s", arch, m, k)
					continue
				}
				if r.Scratch < 0 || r.MaxGroup < 0 {
					t.Errorf("%s %s: %s's metadata lacks scratch or workgroup size: %+v", arch, m, k, r)
					continue
				}
				if r.MaxGroup == 1024 && !oneRowKernels[k] {
					t.Errorf("%s %s: %s compiled for 1024-thread blocks: no __launch_bounds__", arch, m, k)
				}
				if r.Scratch == 0 {
					continue
				}
				if m == "gemm.cu" {
					t.Logf("%s %s: %s uses %d bytes of scratch per lane (prompt GEMM, not checked)", arch, m, k, r.Scratch)
					continue
				}
				t.Errorf("%s %s: %s uses %d bytes of scratch per lane (%d VGPRs)", arch, m, k, r.Scratch, r.VGPRs)
			}
		}
	}
}

// int8Kernel matches the matrix–vector kernels on 8-bit activations: Q4_K
// q/n, Q6_K q/t/c, the 32-element block types' b{R}, the multi-row x
// kernels and the fused Q4_K n12m.
var int8Kernel = regexp.MustCompile(`^mv_(q4_0|q4_1|q5_0|q5_1|q8_0|q4_k|q6_k)_([qn][0-9][0-9]|n12m6?|[tcb][0-9]|x[0-9]+(r[0-9])?)$`)

// TestHIPCodeNativeDot4: every int8 matrix–vector kernel of the gfx90a and
// gfx1030 objects holds the native four-way int8 dot product (v_dot4_i32_i8
// or its sudot4 form), not the multiply-add emulation of dp4a.
func TestHIPCodeNativeDot4(t *testing.T) {
	objdump := llvmTool(t, "llvm-objdump")
	src, err := Source("matvec.cu")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, k := range kernelNames(t, "matvec.cu", src) {
		if int8Kernel.MatchString(k) {
			want = append(want, k)
		}
	}
	if len(want) < 40 {
		t.Fatalf("only %d int8 matvec kernels matched: %v", len(want), want)
	}
	sym := regexp.MustCompile(`^[0-9a-f]+ <([A-Za-z0-9_.]+)>:$`)
	for _, arch := range hipCodeArchs {
		out, err := exec.Command(objdump, "-d", shippedHIPFile(t, "matvec.cu", arch)).Output()
		if err != nil {
			t.Fatalf("%s -d %s matvec.cu: %v", objdump, arch, err)
		}
		dots := map[string]int{}
		cur := ""
		total := 0
		sc := bufio.NewScanner(bytes.NewReader(out))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if m := sym.FindStringSubmatch(line); m != nil {
				cur = m[1]
				continue
			}
			if strings.Contains(line, "v_dot4") {
				dots[cur]++
				total++
			}
		}
		for _, k := range want {
			if dots[k] == 0 {
				t.Errorf("%s: %s has no v_dot4 instruction", arch, k)
			}
		}
		t.Logf("%s: %d v_dot4 instructions over %d int8 kernels", arch, total, len(want))
	}
}

func TestParseKernelNotes(t *testing.T) {
	out := []byte(`amdhsa.kernels:
  - .args:
      - .offset:         0
        .size:           8
    .group_segment_fixed_size: 0
    .max_flat_workgroup_size: 128
    .name:           k1
    .private_segment_fixed_size: 0
    .vgpr_count:     64
  - .agpr_count:     0
    .args:           []
    .max_flat_workgroup_size: 1024
    .name:           k2
    .private_segment_fixed_size: 48
    .vgpr_count:     128
amdhsa.target:   amdgcn-amd-amdhsa--gfx90a
`)
	res, err := parseKernelNotes(out)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]kernelResources{"k1": {0, 64, 128}, "k2": {48, 128, 1024}}
	if len(res) != len(want) {
		t.Fatalf("parsed %v, want %v", res, want)
	}
	for k, w := range want {
		if res[k] != w {
			t.Errorf("%s: %+v, want %+v", k, res[k], w)
		}
	}
}
