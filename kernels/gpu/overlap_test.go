package gpu

import (
	"math"
	"math/rand/v2"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/forge-llm/forge/rocm"
)

// TestKernelsStartWithGridDepend: every kernel of every module begins with
// GRID_DEPEND(), since the backend launches all of them overlapped on
// Hopper: a kernel without the wait would read its input while the kernel
// before it still writes it. One GRID_PREFETCH… statement may come first:
// it only asks L2 for weights, which no kernel of a step writes.
func TestKernelsStartWithGridDepend(t *testing.T) {
	body := regexp.MustCompile(`^\{[\s\\]*(GRID_PREFETCH\w*\([^;]*\);[\s\\]*)?GRID_(DEPEND|WAIT)\(\);`)
	total := 0
	for _, m := range Modules() {
		src, err := Source(m)
		if err != nil {
			t.Fatal(err)
		}
		for _, loc := range regexp.MustCompile(`\bKERNEL\b`).FindAllStringIndex(src, -1) {
			if strings.HasPrefix(src[loc[0]:], "KERNEL extern") { // the macro's definition
				continue
			}
			// The body opens at the first '{' outside parentheses:
			// the signature (launch bounds, parameters) has none.
			depth, i := 0, loc[1]
			for ; i < len(src) && !(depth == 0 && src[i] == '{'); i++ {
				switch src[i] {
				case '(':
					depth++
				case ')':
					depth--
				}
			}
			if line := strings.Count(src[:loc[0]], "\n") + 1; i == len(src) || !body.MatchString(src[i:]) {
				t.Errorf("%s:%d: kernel does not start with GRID_DEPEND(): %.120q", m, line, src[loc[0]:min(len(src), loc[0]+200)])
			}
			total++
		}
	}
	if total < 100 {
		t.Fatalf("found %d kernels; the scan is broken", total)
	}
}

// TestLaunchOverlapChoice: overlapped launches only where every module's
// code holds GRID_DEPEND's wait (built for sm_90 or later) on a CUDA device
// that honours them.
func TestLaunchOverlapChoice(t *testing.T) {
	h100 := rocm.DeviceInfo{Backend: rocm.CUDA, Arch: "sm_90"}
	for _, c := range []struct {
		name  string
		dev   rocm.DeviceInfo
		froms []string
		has   bool
		want  bool
	}{
		{"shipped sm_90 cubins", h100, []string{"shipped cubin sm_90", "shipped cubin sm_90"}, true, true},
		{"compiled for the device", h100, []string{"compiled", "kernel cache"}, true, true},
		{"no cuLaunchKernelEx", h100, []string{"compiled"}, false, false},
		{"one module from compute_80 PTX", h100, []string{"shipped cubin sm_90", "shipped ptx compute_80"}, true, false},
		{"Ampere", rocm.DeviceInfo{Backend: rocm.CUDA, Arch: "sm_86"}, []string{"compiled"}, true, false},
		{"Blackwell compiled", rocm.DeviceInfo{Backend: rocm.CUDA, Arch: "sm_100"}, []string{"compiled"}, true, true},
		{"HIP", rocm.DeviceInfo{Backend: rocm.HIP, Arch: "gfx90a:sramecc+:xnack-"}, []string{"compiled"}, true, false},
	} {
		if got := launchOverlap(c.dev, c.froms, c.has); got != c.want {
			t.Errorf("%s: launchOverlap = %v, want %v", c.name, got, c.want)
		}
	}
	// The variable: on, off, or a clear error naming it.
	for v, want := range map[string]bool{"": true, "on": true, "off": false} {
		if got, err := parseLaunchOverlap(v); err != nil || got != want {
			t.Errorf("parseLaunchOverlap(%q) = %v, %v; want %v", v, got, err, want)
		}
	}
	for _, v := range []string{"of", "0", "OFF"} {
		if _, err := parseLaunchOverlap(v); err == nil || !strings.Contains(err.Error(), EnvLaunchOverlap) {
			t.Errorf("parseLaunchOverlap(%q): error %v, want one naming $%s", v, err, EnvLaunchOverlap)
		}
	}
}

// TestOverlappedLaunchesKeepOrder runs a chain of 4000 small kernels, each
// reading what the one before it wrote (x = x·s, then x = x + y), on a
// backend that launches them overlapped and on one that does not: the
// float32 results must equal the host's same operations bit for bit on
// both, so no kernel started before its predecessor's writes were visible.
// It logs the time a launch takes either way.
func TestOverlappedLaunchesKeepOrder(t *testing.T) {
	sb := gpuBackend(t, false)
	d := sb.w.Device
	var has bool
	if err := sb.do(func(c *rocm.Ctx) error { has = c.HasDependentLaunch(); return nil }); err != nil {
		t.Fatal(err)
	}
	if d.Backend == rocm.CUDA && d.CCMajor >= 9 && has && os.Getenv(EnvLaunchOverlap) != "off" && !sb.overlap {
		t.Errorf("%s (%s) with cuLaunchKernelEx launches without overlap", d.Name, d.Arch)
	}
	const n, rounds = 4096, 2000
	rng := rand.New(rand.NewPCG(rand.Uint64(), 41))
	x0, y := randVec(rng, n, 1), randVec(rng, n, 0.01)
	want := append([]float32(nil), x0...)
	for range rounds {
		for i := range want {
			want[i] *= 1.0009765625
			want[i] += y[i]
		}
	}
	for _, overlap := range []bool{false, true} {
		if overlap && !sb.overlap {
			continue
		}
		b, err := New(sb.w, Options{})
		if err != nil {
			t.Fatal(err)
		}
		b.overlap = overlap
		x, err := b.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		yt, err := b.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Write(x, 0, x0); err != nil {
			t.Fatal(err)
		}
		if err := b.Write(yt, 0, y); err != nil {
			t.Fatal(err)
		}
		if err := b.Sync(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		for range rounds {
			if err := b.Scale(x, x, 1.0009765625, n); err != nil {
				t.Fatal(err)
			}
			if err := b.Add(x, x, yt, n); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Sync(); err != nil {
			t.Fatal(err)
		}
		el := time.Since(start)
		got := download(t, b, x)
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("overlap %v: x[%d] = %v after %d rounds, host %v", overlap, i, got[i], rounds, want[i])
			}
		}
		t.Logf("overlap %v: %d launches in %v (%.2f µs each)", overlap, 2*rounds, el, float64(el.Microseconds())/(2*rounds))
		b.Free(x)
		b.Free(yt)
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestParseDecodeTuning: EnvDecodeTuning's ways, and a clear error for a
// way it does not know.
func TestParseDecodeTuning(t *testing.T) {
	for v, want := range map[string]decodeTuning{
		"":                        defaultTuning,
		"default":                 defaultTuning,
		"none":                    {},
		"none,wide":               {routeWide: true},
		"none,minsplit=64":        {attnMinSplit: 64},
		"default,minsplit=64":     {routeWide: defaultTuning.routeWide, attnMinSplit: 64},
		"none, wide,minsplit=32":  {routeWide: true, attnMinSplit: 32},
		"none,q4grid=12,q6grid=6": {q4Grid: 12, q6Grid: 6},
	} {
		got, err := parseDecodeTuning(v)
		if err != nil || got != want {
			t.Errorf("parseDecodeTuning(%q) = %+v, %v; want %+v", v, got, err, want)
		}
	}
	for _, v := range []string{"fast", "rank", "minsplit=x", "minsplit=-1", "q4grid=0", "q6grid=x", "q4grid=65"} {
		if _, err := parseDecodeTuning(v); err == nil || !strings.Contains(err.Error(), EnvDecodeTuning) {
			t.Errorf("parseDecodeTuning(%q): error %v, want one naming $%s", v, err, EnvDecodeTuning)
		}
	}
}
