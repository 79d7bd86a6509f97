//go:build amd64 && !purego

#include "textflag.h"

// Register-tiled Q8_0 product for prompts and batched decode: four weight
// rows times four activation rows (tokens) per call, each weight block
// loaded once for the four tokens and each token's block once for the four
// rows. The activations come packed by packQ8_0x4 (gemm.go): per block,
// the four tokens' 32 codes, their lane corrections −128·Σ(4 codes) as 8
// int32, and their 4 scales.
//
// Per (row, token, block) the arithmetic is dotQ8_0VNNI's: the exact
// integer products summed in the same 8 int32 lanes (4 adjacent bytes a
// lane), converted to float and added with one fused multiply-add by
// d_w·d_x into that pair's 8 float lanes, summed at the end by HSUM8. The
// lanes are formed as (w+128)·x − 128·Σx by VPDPBUSD on a weight made
// unsigned once per block, instead of |w|·sign(x, w) per pair: the same
// integers, so out equals 16 calls of dotQ8_0VNNI bit for bit.

// GPAIR adds pair (row wr, token t)'s block: corrections c into Y12, the
// products with the codes x, to float, times the product scale at
// soff(R10), into acc.
#define GPAIR(c, x, wr, soff, acc) \
	VMOVDQA           c, Y12          \
	VPDPBUSD          x, wr, Y12      \
	VCVTDQ2PS         Y12, Y12        \
	VFMADD231PS.BCST  soff(R10), Y12, acc

// GROW loads weight row r's block (scale at base, codes at codes) into wr
// (made unsigned) and stores its four product scales d_w·d_x(token t) at
// soff(R10).
#define GROW(base, codes, wr, soff) \
	VMOVDQU      codes, wr         \
	VPXOR        Y13, wr, wr       \
	VPBROADCASTW base, X14         \
	VCVTPH2PS    X14, X14          \
	VMULPS       256(SI), X14, X14 \
	VMOVUPS      X14, soff(R10)

// GOUT stores acc's lane sum at off(AX).
#define GOUT(acc, off) \
	VMOVAPS  acc, Y0           \
	VEXTRACTF128 $1, Y0, X1    \
	VADDPS   X1, X0, X0        \
	VMOVHLPS X0, X0, X1        \
	VADDPS   X1, X0, X0        \
	VMOVSHDUP X0, X1           \
	VADDSS   X1, X0, X0        \
	VMOVSS   X0, off(AX)

// func gemmQ8_0x4x4VNNI(w *byte, rb int, p *byte, nb int, sc *float32, out *float32)
// Rows w, w+rb, w+2rb, w+3rb; p: nb packed blocks of 4 tokens; sc: 16
// floats of scratch; out[4r+t] receives row r · token t.
TEXT ·gemmQ8_0x4x4VNNI(SB), NOSPLIT, $0-48
	MOVQ         w+0(FP), DI
	MOVQ         rb+8(FP), R8
	MOVQ         p+16(FP), SI
	MOVQ         nb+24(FP), CX
	MOVQ         sc+32(FP), R10
	LEAQ         (R8)(R8*2), R9
	MOVL         $0x80808080, AX
	VPBROADCASTD AX, Y13
	VPXORD       Y16, Y16, Y16
	VPXORD       Y17, Y17, Y17
	VPXORD       Y18, Y18, Y18
	VPXORD       Y19, Y19, Y19
	VPXORD       Y20, Y20, Y20
	VPXORD       Y21, Y21, Y21
	VPXORD       Y22, Y22, Y22
	VPXORD       Y23, Y23, Y23
	VPXORD       Y24, Y24, Y24
	VPXORD       Y25, Y25, Y25
	VPXORD       Y26, Y26, Y26
	VPXORD       Y27, Y27, Y27
	VPXORD       Y28, Y28, Y28
	VPXORD       Y29, Y29, Y29
	VPXORD       Y30, Y30, Y30
	VPXORD       Y31, Y31, Y31
	TESTQ        CX, CX
	JEQ          g44done

g44loop:
	GROW((DI), 2(DI), Y0, 0)
	GROW((DI)(R8*1), 2(DI)(R8*1), Y1, 16)
	GROW((DI)(R8*2), 2(DI)(R8*2), Y2, 32)
	GROW((DI)(R9*1), 2(DI)(R9*1), Y3, 48)
	VMOVDQU 0(SI), Y4
	VMOVDQU 32(SI), Y5
	VMOVDQU 64(SI), Y6
	VMOVDQU 96(SI), Y7
	VMOVDQU 128(SI), Y8
	VMOVDQU 160(SI), Y9
	VMOVDQU 192(SI), Y10
	VMOVDQU 224(SI), Y11
	GPAIR(Y8, Y4, Y0, 0, Y16)
	GPAIR(Y9, Y5, Y0, 4, Y17)
	GPAIR(Y10, Y6, Y0, 8, Y18)
	GPAIR(Y11, Y7, Y0, 12, Y19)
	GPAIR(Y8, Y4, Y1, 16, Y20)
	GPAIR(Y9, Y5, Y1, 20, Y21)
	GPAIR(Y10, Y6, Y1, 24, Y22)
	GPAIR(Y11, Y7, Y1, 28, Y23)
	GPAIR(Y8, Y4, Y2, 32, Y24)
	GPAIR(Y9, Y5, Y2, 36, Y25)
	GPAIR(Y10, Y6, Y2, 40, Y26)
	GPAIR(Y11, Y7, Y2, 44, Y27)
	GPAIR(Y8, Y4, Y3, 48, Y28)
	GPAIR(Y9, Y5, Y3, 52, Y29)
	GPAIR(Y10, Y6, Y3, 56, Y30)
	GPAIR(Y11, Y7, Y3, 60, Y31)
	ADDQ $34, DI
	ADDQ $272, SI
	DECQ CX
	JNZ  g44loop

g44done:
	MOVQ out+40(FP), AX
	GOUT(Y16, 0)
	GOUT(Y17, 4)
	GOUT(Y18, 8)
	GOUT(Y19, 12)
	GOUT(Y20, 16)
	GOUT(Y21, 20)
	GOUT(Y22, 24)
	GOUT(Y23, 28)
	GOUT(Y24, 32)
	GOUT(Y25, 36)
	GOUT(Y26, 40)
	GOUT(Y27, 44)
	GOUT(Y28, 48)
	GOUT(Y29, 52)
	GOUT(Y30, 56)
	GOUT(Y31, 60)
	VZEROUPPER
	RET

// func packQ8_0x4AVX512(q *int8, d *float32, pq, pd *byte, nb int)
// packQ8_0x4Go for one row: per block, its 32 codes to pq, their lane
// corrections −128·Σ(4 codes) as 8 int32 to pq+128, its scale to pd;
// both advance by one packed block (272 bytes).
TEXT ·packQ8_0x4AVX512(SB), NOSPLIT, $0-40
	MOVQ         q+0(FP), SI
	MOVQ         d+8(FP), DX
	MOVQ         pq+16(FP), DI
	MOVQ         pd+24(FP), R8
	MOVQ         nb+32(FP), CX
	MOVL         $0x01010101, AX
	VPBROADCASTD AX, Y15
	VPXOR        Y14, Y14, Y14
	TESTQ        CX, CX
	JEQ          packdone

packloop:
	VMOVDQU  (SI), Y0
	VMOVDQU  Y0, (DI)
	VPXOR    Y1, Y1, Y1
	VPDPBUSD Y0, Y15, Y1 // Σ of each 4 codes
	VPSLLD   $7, Y1, Y1
	VPSUBD   Y1, Y14, Y1
	VMOVDQU  Y1, 128(DI)
	MOVL     (DX), AX
	MOVL     AX, (R8)
	ADDQ     $32, SI
	ADDQ     $4, DX
	ADDQ     $272, DI
	ADDQ     $272, R8
	DECQ     CX
	JNZ      packloop

packdone:
	VZEROUPPER
	RET
