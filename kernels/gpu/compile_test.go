package gpu

import (
	"bytes"
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/forge-llm/forge/rocm"
)

// kernelNames lists the kernels a module must define: the names written
// out in its source and those its macros stamp out per type.
func kernelNames(t *testing.T, module, src string) []string {
	t.Helper()
	var names []string
	for _, m := range regexp.MustCompile(`KERNEL void (?:__launch_bounds__\(\d+(?:, \d+)?\) )?([a-z0-9_]+)\(`).FindAllStringSubmatch(src, -1) {
		if !strings.HasPrefix(m[1], "__") {
			names = append(names, m[1])
		}
	}
	types := []string{"f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs", "mxfp4"}
	switch module {
	case "matvec.cu":
		for _, ty := range types {
			names = append(names, "mv_"+ty)
		}
		for _, ty := range []string{"q4_0", "q4_1", "q5_0", "q5_1", "q8_0"} {
			names = append(names, "mv_"+ty+"_b1", "mv_"+ty+"_b2", "mv_"+ty+"_b4")
		}
		names = append(names, "mv_q4_k_x8r2", "mv_q4_k_x16r2", "mv_q6_k_x8r2", "mv_q4_0_x8", "mv_q4_1_x8", "mv_q5_0_x8", "mv_q5_1_x8", "mv_q8_0_x8")
		names = append(names, "mv_q6_k_t1", "mv_q6_k_t2", "mv_q6_k_t4", "mv_q6_k_c1", "mv_q6_k_c2", "mv_q4_k_n12m", "mv_q4_k_n12m6")
		names = append(names, "mv_q4_k_r1u1", "mv_q4_k_r2u1", "mv_q4_k_r1u2", "mv_q4_k_r2u2")
		for _, r := range []string{"11", "21", "12", "22", "14"} {
			names = append(names, "mv_q4_k_q"+r, "mv_q6_k_q"+r, "mv_q4_k_n"+r)
		}
	case "mxfp4.cu":
		names = append(names, "mv_mxfp4_m11", "mv_mxfp4_m21", "mv_mxfp4_m41", "mv_mxfp4_m13", "mv_mxfp4_x8", "moe_mv_mxfp4_21")
		for _, ty := range []string{"q4_0", "q4_1", "q5_0", "q5_1", "q8_0"} {
			names = append(names, "mv_"+ty+"_m11", "mv_"+ty+"_m21", "mv_"+ty+"_mx8", "moe_mv_"+ty+"_m21")
		}
	case "dequant.cu":
		for _, ty := range types {
			names = append(names, "deq16_"+ty, "deq32_"+ty, "embed_"+ty)
		}
	case "attn.cu":
		for _, kv := range []string{"f16", "f32"} {
			names = append(names, "kv_store_"+kv, "attn_decode_"+kv, "attn_decode_rope_"+kv, "attn_prompt_"+kv, "kv_store_paged_"+kv, "attn_paged_"+kv)
		}
		names = append(names, "attn_paged_merge")
	case "pagedfine.cu":
		names = append(names, "attn_paged_fine_f16", "attn_paged_fine_f32")
	case "prefill.cu":
		for _, d := range []string{"64", "128"} {
			names = append(names, "attn_prefill_f16_d"+d, "attn_prefill_v1_f16_d"+d, "attn_prefill_plain_f16_d"+d, "attn_prefill_pieces_f16_d"+d)
		}
	case "archops.cu":
		names = append(names, "attn_ext_f16", "attn_ext_f32")
	}
	return names
}

// TestCompileHIP compiles every kernel module through hiprtc for a CDNA
// (gfx90a, wave64) and an RDNA (gfx1030, wave32) target. It needs only
// hiprtc (ROCm 5.2's libamdhip64, installed by .ci/run), no GPU. The
// compilations run one at a time: ROCm 5.2's hiprtc crashes when two
// programs compile at once.
func TestCompileHIP(t *testing.T) {
	for _, module := range Modules() {
		src, err := Source(module)
		if err != nil {
			t.Fatal(err)
		}
		if includeRE.MatchString(src) {
			t.Fatalf("%s: a local include survived inlining", module)
		}
		for _, arch := range []string{"gfx90a", "gfx1030"} {
			t.Run(module+"/"+arch, func(t *testing.T) {
				code, err := rocm.CompileHIP(src, module, arch, nil)
				if errors.Is(err, rocm.ErrNoDriver) {
					t.Skipf("hiprtc not installed (CI installs libamdhip64-5, libhiprtc-builtins5): %v", err)
				}
				if err != nil {
					t.Fatal(err)
				}
				for _, k := range kernelNames(t, module, src) {
					if !bytes.Contains(code, []byte(k)) {
						t.Errorf("%s for %s: no kernel %q in the code object", module, arch, k)
					}
				}
				t.Logf("%s %s: %d bytes", module, arch, len(code))
			})
		}
	}
}

func TestSourceInlinesHeaders(t *testing.T) {
	src, err := Source("matvec.cu")
	if err != nil {
		t.Fatal(err)
	}
	// common.h is reached twice (directly and through quants.h) but
	// pasted once.
	if n := strings.Count(src, "DEV float warp_sum("); n != 1 {
		t.Fatalf("warp_sum defined %d times in the inlined source", n)
	}
	if _, err := Source("missing.cu"); err == nil {
		t.Fatal("Source of a missing module returned no error")
	}
}
