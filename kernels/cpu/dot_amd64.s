//go:build amd64 && !purego

#include "textflag.h"

// AVX-512 (F, BW, VL, VNNI) dot products of one GGUF weight row with one
// quantized activation row; the plain-Go twins in dot_go.go define what
// each computes. Register use: DI weights, SI activation codes, DX
// activation scales, R8 activation sums, CX block count, Z0 the float
// accumulator.

// HSUM16 adds the 16 floats of Z0 into X0's low lane.
#define HSUM16 \
	VEXTRACTF64X4 $1, Z0, Y1 \
	VADDPS        Y1, Y0, Y0 \
	VEXTRACTF128  $1, Y0, X1 \
	VADDPS        X1, X0, X0 \
	VMOVHLPS      X0, X0, X1 \
	VADDPS        X1, X0, X0 \
	VMOVSHDUP     X0, X1     \
	VADDSS        X1, X0, X0

// HALF loads the f16 at off(DI) widened to float32 into X5.
#define HALF(off) \
	MOVWLZX   off(DI), AX \
	VMOVD     AX, X5      \
	VCVTPH2PS X5, X5

// HSUM8(Y, X, T) adds the 8 floats of Y into X's low lane (T: scratch).
#define HSUM8(y, x, t, tx) \
	VEXTRACTF128 $1, y, tx \
	VADDPS       tx, x, x  \
	VMOVHLPS     x, x, tx  \
	VADDPS       tx, x, x  \
	VMOVSHDUP    x, tx     \
	VADDSS       tx, x, x

// The 32-element kernels reproduce the float arithmetic of llama.cpp's
// AVX2 vec_dot_*_q8_0 exactly, so that greedy decoding follows llama.cpp
// token for token even through near-ties: per block, the exact signed
// integer products summed in 8 int32 lanes (4 adjacent bytes per lane,
// taken as |w| times x with w's sign by VPDPBUSD), converted to float and
// added with one fused multiply-add by d = d_w·d_x into 8 float lanes;
// the lanes are summed at the end as hsum_float_8 does.

// BLOCKDOT leaves in Y4 the 8 float lane sums of the signed codes in Y1
// times the activation codes at xa.
#define BLOCKDOT(xa) \
	VMOVDQU   xa, Y2     \
	VPABSB    Y1, Y3     \
	VPSIGNB   Y1, Y2, Y2 \
	VPXOR     Y4, Y4, Y4 \
	VPDPBUSD  Y2, Y3, Y4 \
	VCVTDQ2PS Y4, Y4

// BLOCKDOTA is BLOCKDOT with |codes| already in Y3 (the next tokens of a
// multi-token kernel).
#define BLOCKDOTA(xa) \
	VMOVDQU   xa, Y2     \
	VPSIGNB   Y1, Y2, Y2 \
	VPXOR     Y4, Y4, Y4 \
	VPDPBUSD  Y2, Y3, Y4 \
	VCVTDQ2PS Y4, Y4

// BLOCKACC adds d_w·d_x·Y4 to acc; d_w is the f16 at woff(DI), d_x the
// float at da.
#define BLOCKACC(woff, da, acc) \
	HALF(woff)               \
	VMULSS       da, X5, X5  \
	VBROADCASTSS X5, Y5      \
	VFMADD231PS  Y4, Y5, acc

// BLOCKACCW is BLOCKACC with d_w already in X13 (HALF once per block for
// all the tokens of a multi-token kernel).
#define BLOCKACCW(da, acc) \
	VMULSS       da, X13, X5 \
	VBROADCASTSS X5, Y5      \
	VFMADD231PS  Y4, Y5, acc

// X4PROLOGUE loads the arguments of a four-token 32-element kernel:
// (w, xq, xd, cols, nb, out), strides R9 (codes) and R11 (scales).
#define X4PROLOGUE \
	MOVQ   w+0(FP), DI         \
	MOVQ   xq+8(FP), SI        \
	MOVQ   xd+16(FP), DX       \
	MOVQ   cols+24(FP), R9     \
	MOVQ   nb+32(FP), CX       \
	LEAQ   (R9)(R9*2), R10     \
	MOVQ   CX, R11             \
	SHLQ   $2, R11             \
	LEAQ   (R11)(R11*2), R12   \
	VXORPS Y0, Y0, Y0          \
	VXORPS Y6, Y6, Y6          \
	VXORPS Y7, Y7, Y7          \
	VXORPS Y8, Y8, Y8

// X4TOKENS multiplies the signed codes in Y1 with the 4 tokens' blocks.
#define X4TOKENS \
	HALF(0)                       \
	VMOVAPS X5, X13               \
	BLOCKDOT((SI))                \
	BLOCKACCW((DX), Y0)           \
	BLOCKDOTA((SI)(R9*1))         \
	BLOCKACCW((DX)(R11*1), Y6)    \
	BLOCKDOTA((SI)(R9*2))         \
	BLOCKACCW((DX)(R11*2), Y7)    \
	BLOCKDOTA((SI)(R10*1))        \
	BLOCKACCW((DX)(R12*1), Y8)

// X4EPILOGUE stores the 4 sums to out.
#define X4EPILOGUE \
	MOVQ   out+40(FP), AX      \
	HSUM8(Y0, X0, Y1, X1)      \
	VMOVSS X0, 0(AX)           \
	HSUM8(Y6, X6, Y1, X1)      \
	VMOVSS X6, 4(AX)           \
	HSUM8(Y7, X7, Y1, X1)      \
	VMOVSS X7, 8(AX)           \
	HSUM8(Y8, X8, Y1, X1)      \
	VMOVSS X8, 12(AX)          \
	VZEROUPPER

// func dotQ8_0VNNI(w *byte, xq *int8, xd *float32, nb int) float32
// Q8_0 block: d f16, 32 int8 codes (34 bytes).
TEXT ·dotQ8_0VNNI(SB), NOSPLIT, $0-36
	MOVQ   w+0(FP), DI
	MOVQ   xq+8(FP), SI
	MOVQ   xd+16(FP), DX
	MOVQ   nb+24(FP), CX
	VXORPS Y0, Y0, Y0
	TESTQ  CX, CX
	JEQ    q80done

q80loop:
	// Weights stream from memory once. A core sustains only ~10 misses in
	// flight, so ask ~2 KiB (32 lines) ahead: on bench86m Q8_0 decode
	// 512 bytes gave 142 tok/s, 2048–3072 gave 180–215 (2 threads).
	PREFETCHT0 2048(DI)
	VMOVDQU 2(DI), Y1
	BLOCKDOT((SI))
	BLOCKACC(0, (DX), Y0)
	ADDQ    $34, DI
	ADDQ    $32, SI
	ADDQ    $4, DX
	DECQ    CX
	JNZ     q80loop

q80done:
	HSUM8(Y0, X0, Y1, X1)
	VMOVSS X0, ret+32(FP)
	VZEROUPPER
	RET

// func dotQ8_0x4VNNI(w *byte, xq *int8, xd *float32, cols, nb int, out *float32)
// dotQ8_0VNNI for 4 activation rows (tokens) cols codes apart, each weight
// block loaded once; the same arithmetic per token, so results equal 4
// single calls bit for bit. out receives 4 floats.
TEXT ·dotQ8_0x4VNNI(SB), NOSPLIT, $0-48
	MOVQ   w+0(FP), DI
	MOVQ   xq+8(FP), SI
	MOVQ   xd+16(FP), DX
	MOVQ   cols+24(FP), R9
	MOVQ   nb+32(FP), CX
	LEAQ   (R9)(R9*2), R10
	MOVQ   CX, R11
	SHLQ   $2, R11
	LEAQ   (R11)(R11*2), R12
	VXORPS Y0, Y0, Y0
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	TESTQ  CX, CX
	JEQ    q80x4done

q80x4loop:
	VMOVDQU 2(DI), Y1
	X4TOKENS
	ADDQ    $34, DI
	ADDQ    $32, SI
	ADDQ    $4, DX
	DECQ    CX
	JNZ     q80x4loop

q80x4done:
	MOVQ   out+40(FP), AX
	HSUM8(Y0, X0, Y1, X1)
	VMOVSS X0, 0(AX)
	HSUM8(Y6, X6, Y1, X1)
	VMOVSS X6, 4(AX)
	HSUM8(Y7, X7, Y1, X1)
	VMOVSS X7, 8(AX)
	HSUM8(Y8, X8, Y1, X1)
	VMOVSS X8, 12(AX)
	VZEROUPPER
	RET

// func dotQ4_0VNNI(w *byte, xq *int8, xd *float32, nb int) float32
// Q4_0 block: d f16, 16 bytes of nibbles (byte j: element j low, j+16
// high); codes nibble − 8.
TEXT ·dotQ4_0VNNI(SB), NOSPLIT, $0-36
	MOVQ         w+0(FP), DI
	MOVQ         xq+8(FP), SI
	MOVQ         xd+16(FP), DX
	MOVQ         nb+24(FP), CX
	VXORPS       Y0, Y0, Y0
	MOVL         $0x0F0F0F0F, AX
	VPBROADCASTD AX, Y15
	MOVL         $0x08080808, AX
	VPBROADCASTD AX, Y14
	TESTQ        CX, CX
	JEQ          q40done

q40loop:
	PREFETCHT0  512(DI)
	VMOVDQU     2(DI), X1
	VPSRLW      $4, X1, X2
	VINSERTI128 $1, X2, Y1, Y1
	VPAND       Y15, Y1, Y1
	VPSUBB      Y14, Y1, Y1
	BLOCKDOT((SI))
	BLOCKACC(0, (DX), Y0)
	ADDQ        $18, DI
	ADDQ        $32, SI
	ADDQ        $4, DX
	DECQ        CX
	JNZ         q40loop

q40done:
	HSUM8(Y0, X0, Y1, X1)
	VMOVSS X0, ret+32(FP)
	VZEROUPPER
	RET

// func dotQ5_0VNNI(w *byte, xq *int8, xd *float32, nb int) float32
// Q5_0 block: d f16, qh u32 (fifth bits), 16 bytes of nibbles; codes
// (nibble | bit<<4) − 16, formed as nibble | 0xF0 where the bit is clear.
TEXT ·dotQ5_0VNNI(SB), NOSPLIT, $0-36
	MOVQ         w+0(FP), DI
	MOVQ         xq+8(FP), SI
	MOVQ         xd+16(FP), DX
	MOVQ         nb+24(FP), CX
	VXORPS       Y0, Y0, Y0
	MOVL         $0x0F0F0F0F, AX
	VPBROADCASTD AX, Y15
	MOVL         $0xF0F0F0F0, AX
	VPBROADCASTD AX, Y14
	TESTQ        CX, CX
	JEQ          q50done

q50loop:
	PREFETCHT0  512(DI)
	VMOVDQU     6(DI), X1
	VPSRLW      $4, X1, X2
	VINSERTI128 $1, X2, Y1, Y1
	VPAND       Y15, Y1, Y1
	MOVL        2(DI), AX
	KMOVD       AX, K1
	VPMOVM2B    K1, Y3
	VPANDN      Y14, Y3, Y3
	VPOR        Y3, Y1, Y1
	BLOCKDOT((SI))
	BLOCKACC(0, (DX), Y0)
	ADDQ        $22, DI
	ADDQ        $32, SI
	ADDQ        $4, DX
	DECQ        CX
	JNZ         q50loop

q50done:
	HSUM8(Y0, X0, Y1, X1)
	VMOVSS X0, ret+32(FP)
	VZEROUPPER
	RET

// func dotQ4_0x4VNNI(w *byte, xq *int8, xd *float32, cols, nb int, out *float32)
TEXT ·dotQ4_0x4VNNI(SB), NOSPLIT, $0-48
	X4PROLOGUE
	MOVL         $0x0F0F0F0F, AX
	VPBROADCASTD AX, Y15
	MOVL         $0x08080808, AX
	VPBROADCASTD AX, Y14
	TESTQ        CX, CX
	JEQ          q40x4done

q40x4loop:
	VMOVDQU     2(DI), X1
	VPSRLW      $4, X1, X2
	VINSERTI128 $1, X2, Y1, Y1
	VPAND       Y15, Y1, Y1
	VPSUBB      Y14, Y1, Y1
	X4TOKENS
	ADDQ        $18, DI
	ADDQ        $32, SI
	ADDQ        $4, DX
	DECQ        CX
	JNZ         q40x4loop

q40x4done:
	X4EPILOGUE
	RET

// func dotQ5_0x4VNNI(w *byte, xq *int8, xd *float32, cols, nb int, out *float32)
TEXT ·dotQ5_0x4VNNI(SB), NOSPLIT, $0-48
	X4PROLOGUE
	MOVL         $0x0F0F0F0F, AX
	VPBROADCASTD AX, Y15
	MOVL         $0xF0F0F0F0, AX
	VPBROADCASTD AX, Y14
	TESTQ        CX, CX
	JEQ          q50x4done

q50x4loop:
	VMOVDQU     6(DI), X1
	VPSRLW      $4, X1, X2
	VINSERTI128 $1, X2, Y1, Y1
	VPAND       Y15, Y1, Y1
	MOVL        2(DI), AX
	KMOVD       AX, K1
	VPMOVM2B    K1, Y3
	VPANDN      Y14, Y3, Y3
	VPOR        Y3, Y1, Y1
	X4TOKENS
	ADDQ        $22, DI
	ADDQ        $32, SI
	ADDQ        $4, DX
	DECQ        CX
	JNZ         q50x4loop

q50x4done:
	X4EPILOGUE
	RET

// func dotF16x4AVX512(w *byte, x *float32, cols, n int, out *float32)
// dotF16SeqAVX512 for 4 activation rows cols floats apart: each 16 weights
// are widened once and used 4 times; every output keeps its own single
// accumulator, so results equal 4 single calls bit for bit.
TEXT ·dotF16x4AVX512(SB), NOSPLIT, $0-40
	MOVQ   w+0(FP), DI
	MOVQ   x+8(FP), SI
	MOVQ   cols+16(FP), R9
	MOVQ   n+24(FP), CX
	SHLQ   $2, R9
	LEAQ   (R9)(R9*2), R10
	VXORPS Z0, Z0, Z0
	VXORPS Z6, Z6, Z6
	VXORPS Z7, Z7, Z7
	VXORPS Z8, Z8, Z8

f16x4loop:
	VCVTPH2PS   (DI), Z4
	VFMADD231PS (SI), Z4, Z0
	VFMADD231PS (SI)(R9*1), Z4, Z6
	VFMADD231PS (SI)(R9*2), Z4, Z7
	VFMADD231PS (SI)(R10*1), Z4, Z8
	ADDQ        $32, DI
	ADDQ        $64, SI
	SUBQ        $16, CX
	JNZ         f16x4loop
	MOVQ        out+32(FP), AX
	HSUM16
	VMOVSS      X0, 0(AX)
	VMOVAPS     Z6, Z0
	HSUM16
	VMOVSS      X0, 4(AX)
	VMOVAPS     Z7, Z0
	HSUM16
	VMOVSS      X0, 8(AX)
	VMOVAPS     Z8, Z0
	HSUM16
	VMOVSS      X0, 12(AX)
	VZEROUPPER
	RET

// VPERMW indices of the scale words for 64 bytes of Q4_K nibbles (see
// q4kOrder): low nibbles of the first 128 values are groups 0 (words
// 0–15) and 2 (16–31), high nibbles groups 1 and 3; likewise 4–7 for the
// second 128.
DATA q4kidx<>+0(SB)/8, $0
DATA q4kidx<>+8(SB)/8, $0
DATA q4kidx<>+16(SB)/8, $0
DATA q4kidx<>+24(SB)/8, $0
DATA q4kidx<>+32(SB)/8, $0x0002000200020002
DATA q4kidx<>+40(SB)/8, $0x0002000200020002
DATA q4kidx<>+48(SB)/8, $0x0002000200020002
DATA q4kidx<>+56(SB)/8, $0x0002000200020002
DATA q4kidx<>+64(SB)/8, $0x0001000100010001
DATA q4kidx<>+72(SB)/8, $0x0001000100010001
DATA q4kidx<>+80(SB)/8, $0x0001000100010001
DATA q4kidx<>+88(SB)/8, $0x0001000100010001
DATA q4kidx<>+96(SB)/8, $0x0003000300030003
DATA q4kidx<>+104(SB)/8, $0x0003000300030003
DATA q4kidx<>+112(SB)/8, $0x0003000300030003
DATA q4kidx<>+120(SB)/8, $0x0003000300030003
DATA q4kidx<>+128(SB)/8, $0x0004000400040004
DATA q4kidx<>+136(SB)/8, $0x0004000400040004
DATA q4kidx<>+144(SB)/8, $0x0004000400040004
DATA q4kidx<>+152(SB)/8, $0x0004000400040004
DATA q4kidx<>+160(SB)/8, $0x0006000600060006
DATA q4kidx<>+168(SB)/8, $0x0006000600060006
DATA q4kidx<>+176(SB)/8, $0x0006000600060006
DATA q4kidx<>+184(SB)/8, $0x0006000600060006
DATA q4kidx<>+192(SB)/8, $0x0005000500050005
DATA q4kidx<>+200(SB)/8, $0x0005000500050005
DATA q4kidx<>+208(SB)/8, $0x0005000500050005
DATA q4kidx<>+216(SB)/8, $0x0005000500050005
DATA q4kidx<>+224(SB)/8, $0x0007000700070007
DATA q4kidx<>+232(SB)/8, $0x0007000700070007
DATA q4kidx<>+240(SB)/8, $0x0007000700070007
DATA q4kidx<>+248(SB)/8, $0x0007000700070007
GLOBL q4kidx<>(SB), RODATA|NOPTR, $256

// Constants for the vector unpacking of Q4_K's 12 scale bytes.
DATA k4m3f<>+0(SB)/8, $0x3f3f3f3f3f3f3f3f
DATA k4m3f<>+8(SB)/8, $0x3f3f3f3f3f3f3f3f
GLOBL k4m3f<>(SB), RODATA|NOPTR, $16
DATA k4m0f<>+0(SB)/8, $0x0f0f0f0f0f0f0f0f
DATA k4m0f<>+8(SB)/8, $0x0f0f0f0f0f0f0f0f
GLOBL k4m0f<>(SB), RODATA|NOPTR, $16
DATA k4m03<>+0(SB)/8, $0x0303030303030303
DATA k4m03<>+8(SB)/8, $0x0303030303030303
GLOBL k4m03<>(SB), RODATA|NOPTR, $16
DATA k4sh<>+0(SB)/8, $0x0000000400000000
DATA k4sh<>+8(SB)/8, $0
GLOBL k4sh<>(SB), RODATA|NOPTR, $16

// Word indices {8,8,9,9,…,15,15}: each min twice, to pair with the two
// 16-value sums of its group.
DATA k4minidx<>+0(SB)/8, $0x0009000900080008
DATA k4minidx<>+8(SB)/8, $0x000b000b000a000a
DATA k4minidx<>+16(SB)/8, $0x000d000d000c000c
DATA k4minidx<>+24(SB)/8, $0x000f000f000e000e
GLOBL k4minidx<>(SB), RODATA|NOPTR, $32

// Q4KUNPACK leaves in Y1 the 16 words sc0…sc7, mn0…mn7 of the super-block
// at DI (see dequant.BlockQ4_K for the packing), using vector ops only.
#define Q4KUNPACK Q4KUNPACKT(X2, X3)

// Q4KUNPACKT is Q4KUNPACK with scratch registers t2, t3.
#define Q4KUNPACKT(t2, t3) \
	VMOVDQU    4(DI), X1              \
	VPSRLD     $6, X1, t2             \
	VPAND      k4m03<>(SB), t2, t2    \
	VPSLLD     $4, t2, t2             \
	VPSHUFD    $0xAA, X1, t3          \
	VPSRLVD    k4sh<>(SB), t3, t3     \
	VPAND      k4m0f<>(SB), t3, t3    \
	VPOR       t2, t3, t3             \
	VPAND      k4m3f<>(SB), X1, X1    \
	VPUNPCKLDQ t3, X1, X1             \
	VPMOVZXBW  X1, Y1

// Q4KPAIR decodes 64 bytes of nibbles at qoff(DI) into lo (low nibbles)
// and hi (high nibbles), and their scale words into sclo, schi (Z1: the
// unpacked scales; idxlo, idxhi: q4kidx rows).
#define Q4KPAIR(qoff, lo, hi, sclo, schi, idxlo, idxhi) \
	VMOVDQU64 qoff(DI), lo  \
	VPSRLW    $4, lo, hi    \
	VPANDD    Z15, lo, lo   \
	VPANDD    Z15, hi, hi   \
	VPERMW    Z1, idxlo, sclo \
	VPERMW    Z1, idxhi, schi

// Q4KSUMS leaves in the int32 lanes of Z4 Σ sc·q·x over the super-block
// decoded into Z16–Z19 (nibbles) and Z20–Z23 (scale words), against the
// 256 codes at xp in q4kOrder.
#define Q4KSUMS(xp) \
	VPMADDUBSW (xp), Z16, Z10    \
	VPMADDWD   Z20, Z10, Z4      \
	VPMADDUBSW 64(xp), Z17, Z10  \
	VPDPWSSD   Z21, Z10, Z4      \
	VPMADDUBSW 128(xp), Z18, Z10 \
	VPDPWSSD   Z22, Z10, Z4      \
	VPMADDUBSW 192(xp), Z19, Z10 \
	VPDPWSSD   Z23, Z10, Z4

// func dotQ4_KVNNI(w *byte, xq *int8, xd *float32, bs *int16, nb int) float32
// Per super-block (144 bytes: d, dmin f16, 12 bytes of 6-bit scales and
// mins, 128 bytes of nibbles): d_x·(d·Σ_g sc_g·Σ q·x − dmin·Σ_g mn_g·Σx_g),
// the codes xq in q4kOrder.
TEXT ·dotQ4_KVNNI(SB), NOSPLIT, $0-44
	MOVQ         w+0(FP), DI
	MOVQ         xq+8(FP), SI
	MOVQ         xd+16(FP), DX
	MOVQ         bs+24(FP), R8
	MOVQ         nb+32(FP), CX
	VXORPS       Z0, Z0, Z0
	VXORPS       Y9, Y9, Y9
	MOVL         $0x0F0F0F0F, AX
	VPBROADCASTD AX, Z15
	VMOVDQU64    q4kidx<>+0(SB), Z12
	VMOVDQU64    q4kidx<>+64(SB), Z13
	VMOVDQU64    q4kidx<>+128(SB), Z14
	VMOVDQU64    q4kidx<>+192(SB), Z30
	VMOVDQU      k4minidx<>(SB), Y11
	TESTQ        CX, CX
	JEQ          q4kdone

q4kloop:
	// ~2 KiB ahead, as in dotQ8_0VNNI (+10 % Q4_K_M decode over 576).
	PREFETCHT0 2112(DI)
	PREFETCHT0 2176(DI)
	PREFETCHT0 2240(DI)
	// Scales and mins as words (Y1), mins paired with the block sums.
	Q4KUNPACK
	VPERMW       Y1, Y11, Y3
	VPMADDWD     (R8), Y3, Y3
	VCVTDQ2PS    Y3, Y3
	VMULPS.BCST  (DX), Y3, Y3
	VPBROADCASTW 2(DI), X5
	VCVTPH2PS    X5, Y5
	VFMADD231PS  Y5, Y3, Y9

	// Scaled codes.
	Q4KPAIR(16, Z16, Z17, Z20, Z21, Z12, Z13)
	Q4KPAIR(80, Z18, Z19, Z22, Z23, Z14, Z30)
	Q4KSUMS(SI)
	VCVTDQ2PS    Z4, Z4
	VMULPS.BCST  (DX), Z4, Z4
	VPBROADCASTW (DI), Y5
	VCVTPH2PS    Y5, Z5
	VFMADD231PS  Z5, Z4, Z0

	ADDQ $144, DI
	ADDQ $256, SI
	ADDQ $4, DX
	ADDQ $32, R8
	DECQ CX
	JNZ  q4kloop

q4kdone:
	VEXTRACTF128 $1, Y9, X1
	VADDPS       X1, X9, X9
	VMOVHLPS     X9, X9, X1
	VADDPS       X1, X9, X9
	VMOVSHDUP    X9, X1
	VADDSS       X1, X9, X9
	HSUM16
	VSUBSS       X9, X0, X0
	VMOVSS       X0, ret+40(FP)
	VZEROUPPER
	RET

// Word shifts for Q6_K's high bits: lanes 0–15 by 0 and 16–31 by 2, and
// lanes 0–15 by 4 and 16–31 by 6.
DATA shiftQ6Ka<>+0(SB)/8, $0
DATA shiftQ6Ka<>+8(SB)/8, $0
DATA shiftQ6Ka<>+16(SB)/8, $0
DATA shiftQ6Ka<>+24(SB)/8, $0
DATA shiftQ6Ka<>+32(SB)/8, $0x0002000200020002
DATA shiftQ6Ka<>+40(SB)/8, $0x0002000200020002
DATA shiftQ6Ka<>+48(SB)/8, $0x0002000200020002
DATA shiftQ6Ka<>+56(SB)/8, $0x0002000200020002
GLOBL shiftQ6Ka<>(SB), RODATA|NOPTR, $64
DATA shiftQ6Kb<>+0(SB)/8, $0x0004000400040004
DATA shiftQ6Kb<>+8(SB)/8, $0x0004000400040004
DATA shiftQ6Kb<>+16(SB)/8, $0x0004000400040004
DATA shiftQ6Kb<>+24(SB)/8, $0x0004000400040004
DATA shiftQ6Kb<>+32(SB)/8, $0x0006000600060006
DATA shiftQ6Kb<>+40(SB)/8, $0x0006000600060006
DATA shiftQ6Kb<>+48(SB)/8, $0x0006000600060006
DATA shiftQ6Kb<>+56(SB)/8, $0x0006000600060006
GLOBL shiftQ6Kb<>(SB), RODATA|NOPTR, $64

// Word lanes 8k…8k+7 = k: the 32 products of 64 codes span 4 groups of 16.
DATA idxQ6K<>+0(SB)/8, $0
DATA idxQ6K<>+8(SB)/8, $0
DATA idxQ6K<>+16(SB)/8, $0x0001000100010001
DATA idxQ6K<>+24(SB)/8, $0x0001000100010001
DATA idxQ6K<>+32(SB)/8, $0x0002000200020002
DATA idxQ6K<>+40(SB)/8, $0x0002000200020002
DATA idxQ6K<>+48(SB)/8, $0x0003000300030003
DATA idxQ6K<>+56(SB)/8, $0x0003000300030003
GLOBL idxQ6K<>(SB), RODATA|NOPTR, $64

// Q6KHALF handles one 128-value half: ql at qloff(DI), qh at qhoff(DI),
// codes at xoff(SI) and xoff+64(SI); adds Σ sc·q·x (q unsigned, 0…63) to
// Z4. ia, ib are the scale indices of its two 64-value parts.
#define Q6KHALF(qloff, qhoff, xoff, ia, ib) \
	VMOVDQU64       qloff(DI), Z7  \
	VPSRLW          $4, Z7, Z8     \
	VPANDD          Z15, Z7, Z7    \
	VPANDD          Z15, Z8, Z8    \
	VBROADCASTI64X4 qhoff(DI), Z9  \
	VPSRLVW         Z13, Z9, Z10   \
	VPSRLVW         Z12, Z9, Z11   \
	VPANDD          Z14, Z10, Z10  \
	VPANDD          Z14, Z11, Z11  \
	VPSLLW          $4, Z10, Z10   \
	VPSLLW          $4, Z11, Z11   \
	VPORD           Z10, Z7, Z7    \
	VPORD           Z11, Z8, Z8    \
	VPERMW          Z1, ia, Z16    \
	VPERMW          Z1, ib, Z17    \
	VPMADDUBSW      xoff(SI), Z7, Z18 \
	VPMADDUBSW      xoff+64(SI), Z8, Z19 \
	VPDPWSSD        Z16, Z18, Z4   \
	VPDPWSSD        Z17, Z19, Z4

// func dotQ6_KVNNI(w *byte, xq *int8, xd *float32, bs *int16, nb int) float32
// Per super-block (210 bytes: ql[128], qh[64], int8 scales[16], d f16):
// d·d_x·Σ_g sc_g·(Σ q·x − 32·Σx_g).
TEXT ·dotQ6_KVNNI(SB), NOSPLIT, $0-44
	MOVQ         w+0(FP), DI
	MOVQ         xq+8(FP), SI
	MOVQ         xd+16(FP), DX
	MOVQ         bs+24(FP), R8
	MOVQ         nb+32(FP), CX
	VXORPS       Z0, Z0, Z0
	MOVL         $0x0F0F0F0F, AX
	VPBROADCASTD AX, Z15
	MOVL         $0x03030303, AX
	VPBROADCASTD AX, Z14
	VMOVDQU64    shiftQ6Ka<>(SB), Z13
	VMOVDQU64    shiftQ6Kb<>(SB), Z12
	VMOVDQU64    idxQ6K<>(SB), Z21
	MOVL         $0x00040004, AX
	VPBROADCASTD AX, Z20
	VPADDW       Z20, Z21, Z22 // the scale indices of groups 4–7, 8–11, 12–15
	VPADDW       Z20, Z22, Z23
	VPADDW       Z20, Z23, Z24
	TESTQ        CX, CX
	JEQ          q6kdone

q6kloop:
	PREFETCHT0 2176(DI)
	PREFETCHT0 2240(DI)
	PREFETCHT0 2304(DI)
	PREFETCHT0 2368(DI)
	VPMOVSXBW 192(DI), Y1 // 16 scale words
	VPMADDWD  (R8), Y1, Y2
	VPSLLD    $5, Y2, Y2
	VPXORD    Z4, Z4, Z4
	VPSUBD    Z2, Z4, Z4  // −32·Σ sc·Σx
	Q6KHALF(0, 128, 0, Z21, Z22)
	Q6KHALF(64, 160, 128, Z23, Z24)
	VCVTDQ2PS    Z4, Z4
	HALF(208)
	VMULSS       (DX), X5, X5
	VBROADCASTSS X5, Z5
	VFMADD231PS  Z5, Z4, Z0
	ADDQ         $210, DI
	ADDQ         $256, SI
	ADDQ         $4, DX
	ADDQ         $32, R8
	DECQ         CX
	JNZ          q6kloop

q6kdone:
	HSUM16
	VMOVSS X0, ret+40(FP)
	VZEROUPPER
	RET

// func dotF16AVX512(w *byte, x *float32, n int) float32
// n is a positive multiple of 64. The arithmetic of ggml_vec_dot_f16 with
// AVX-512: four 16-lane accumulators over steps of 64, then (a0+a2) +
// (a1+a3), then the 16 lanes summed as _mm512_reduce_add_ps does.
TEXT ·dotF16AVX512(SB), NOSPLIT, $0-28
	MOVQ   w+0(FP), DI
	MOVQ   x+8(FP), SI
	MOVQ   n+16(FP), CX
	VXORPS Z0, Z0, Z0
	VXORPS Z1, Z1, Z1
	VXORPS Z2, Z2, Z2
	VXORPS Z3, Z3, Z3

f16loop:
	VCVTPH2PS   (DI), Z4
	VCVTPH2PS   32(DI), Z5
	VCVTPH2PS   64(DI), Z6
	VCVTPH2PS   96(DI), Z7
	VFMADD231PS (SI), Z4, Z0
	VFMADD231PS 64(SI), Z5, Z1
	VFMADD231PS 128(SI), Z6, Z2
	VFMADD231PS 192(SI), Z7, Z3
	ADDQ        $128, DI
	ADDQ        $256, SI
	SUBQ        $64, CX
	JNZ         f16loop
	VADDPS      Z2, Z0, Z0
	VADDPS      Z3, Z1, Z1
	VADDPS      Z1, Z0, Z0
	HSUM16
	VMOVSS      X0, ret+24(FP)
	VZEROUPPER
	RET

// func dotF32AVX512(a, b *float32, n int) float32
// n is a positive multiple of 32.
TEXT ·dotF32AVX512(SB), NOSPLIT, $0-28
	MOVQ   a+0(FP), DI
	MOVQ   b+8(FP), SI
	MOVQ   n+16(FP), CX
	VXORPS Z0, Z0, Z0
	VXORPS Z1, Z1, Z1

f32loop:
	VMOVUPS     (DI), Z2
	VMOVUPS     64(DI), Z3
	VFMADD231PS (SI), Z2, Z0
	VFMADD231PS 64(SI), Z3, Z1
	ADDQ        $128, DI
	ADDQ        $128, SI
	SUBQ        $32, CX
	JNZ         f32loop
	VADDPS      Z1, Z0, Z0
	HSUM16
	VMOVSS      X0, ret+24(FP)
	VZEROUPPER
	RET

// func axpyF32AVX512(y, x *float32, a float32, n int)
// y += a·x; n is a positive multiple of 16.
TEXT ·axpyF32AVX512(SB), NOSPLIT, $0-32
	MOVQ         y+0(FP), DI
	MOVQ         x+8(FP), SI
	VBROADCASTSS a+16(FP), Z0
	MOVQ         n+24(FP), CX

axpyloop:
	VMOVUPS     (DI), Z1
	VFMADD231PS (SI), Z0, Z1
	VMOVUPS     Z1, (DI)
	ADDQ        $64, DI
	ADDQ        $64, SI
	SUBQ        $16, CX
	JNZ         axpyloop
	VZEROUPPER
	RET

// Q4KTOKEN adds one token to acc (scaled sums) and macc (scaled mins):
// xp its codes, da its d_x, ba its 16 block sums.
#define Q4KTOKEN(xp, da, ba, acc, macc) \
	Q4KSUMS(xp)                   \
	VCVTDQ2PS   Z4, Z4            \
	VMULPS.BCST da, Z4, Z4        \
	VFMADD231PS Z24, Z4, acc      \
	VPMADDWD    ba, Y3, Y6        \
	VCVTDQ2PS   Y6, Y6            \
	VMULPS.BCST da, Y6, Y6        \
	VFMADD231PS Y25, Y6, macc

// HSUMZ adds the 16 floats of z (y, x: its lower parts) into x's low lane.
#define HSUMZ(z, y, x) \
	VEXTRACTF64X4 $1, z, Y5 \
	VADDPS        Y5, y, y  \
	VEXTRACTF128  $1, y, X5 \
	VADDPS        X5, x, x  \
	VMOVHLPS      x, x, X5  \
	VADDPS        X5, x, x  \
	VMOVSHDUP     x, X5     \
	VADDSS        X5, x, x

// Q4KX4FIN finishes one token as dotQ4_KVNNI does, so that its result is
// bit for bit the one-token kernel's (batch invariance): the 8 lanes of
// scaled mins summed in that order, the 16 lanes of scaled sums likewise,
// then the one subtracted from the other.
#define Q4KX4FIN(acc, accy, accx, macc) \
	VMOVAPS      macc, Y1   \
	VEXTRACTF128 $1, Y1, X5 \
	VADDPS       X5, X1, X1 \
	VMOVHLPS     X1, X1, X5 \
	VADDPS       X5, X1, X1 \
	VMOVSHDUP    X1, X5     \
	VADDSS       X5, X1, X1 \
	HSUMZ(acc, accy, accx)  \
	VSUBSS       X1, accx, accx

// func dotQ4_Kx4VNNI(w *byte, xq *int8, xd *float32, bs *int16, cols, nb int, out *float32)
// dotQ4_KVNNI for 4 activation rows cols codes apart: each super-block's
// nibbles and scales are decoded once and used for the 4 tokens.
// Accumulators: Z0, Z7, Z8, Z9 (scaled sums), Y26…Y29 (scaled mins).
TEXT ·dotQ4_Kx4VNNI(SB), NOSPLIT, $0-56
	MOVQ         w+0(FP), DI
	MOVQ         xq+8(FP), SI
	MOVQ         xd+16(FP), DX
	MOVQ         bs+24(FP), R8
	MOVQ         cols+32(FP), R13
	MOVQ         nb+40(FP), CX
	LEAQ         (SI)(R13*1), R9  // token 1 codes
	LEAQ         (SI)(R13*2), R10 // token 2 codes
	LEAQ         (R10)(R13*1), BX // token 3 codes
	MOVQ         CX, R11
	SHLQ         $2, R11          // d_x stride in bytes
	LEAQ         (R11)(R11*2), R12
	SHRQ         $3, R13          // block-sum stride in bytes: cols/16 int16
	MOVL         $0x0F0F0F0F, AX
	VPBROADCASTD AX, Z15
	LEAQ         (R13)(R13*2), AX
	VMOVDQU64    q4kidx<>+0(SB), Z12
	VMOVDQU64    q4kidx<>+64(SB), Z13
	VMOVDQU64    q4kidx<>+128(SB), Z14
	VMOVDQU64    q4kidx<>+192(SB), Z30
	VMOVDQU      k4minidx<>(SB), Y11
	VXORPS       Z0, Z0, Z0
	VXORPS       Z7, Z7, Z7
	VXORPS       Z8, Z8, Z8
	VXORPS       Z9, Z9, Z9
	VXORPS       Y26, Y26, Y26
	VXORPS       Y27, Y27, Y27
	VXORPS       Y28, Y28, Y28
	VXORPS       Y29, Y29, Y29
	TESTQ        CX, CX
	JEQ          q4kx4done

q4kx4loop:
	Q4KUNPACK
	VPERMW       Y1, Y11, Y3 // min pairs
	Q4KPAIR(16, Z16, Z17, Z20, Z21, Z12, Z13)
	Q4KPAIR(80, Z18, Z19, Z22, Z23, Z14, Z30)
	VPBROADCASTW (DI), Y5
	VCVTPH2PS    Y5, Z24      // d_w in 16 lanes
	VPBROADCASTW 2(DI), X5
	VCVTPH2PS    X5, Y25      // dmin in 8 lanes
	Q4KTOKEN(SI, (DX), (R8), Z0, Y26)
	Q4KTOKEN(R9, (DX)(R11*1), (R8)(R13*1), Z7, Y27)
	Q4KTOKEN(R10, (DX)(R11*2), (R8)(R13*2), Z8, Y28)
	Q4KTOKEN(BX, (DX)(R12*1), (R8)(AX*1), Z9, Y29)
	ADDQ         $144, DI
	ADDQ         $256, SI
	ADDQ         $256, R9
	ADDQ         $256, R10
	ADDQ         $256, BX
	ADDQ         $4, DX
	ADDQ         $32, R8
	DECQ         CX
	JNZ          q4kx4loop

q4kx4done:
	MOVQ   out+48(FP), AX
	Q4KX4FIN(Z0, Y0, X0, Y26)
	VMOVSS X0, 0(AX)
	Q4KX4FIN(Z7, Y7, X7, Y27)
	VMOVSS X7, 4(AX)
	Q4KX4FIN(Z8, Y8, X8, Y28)
	VMOVSS X8, 8(AX)
	Q4KX4FIN(Z9, Y9, X9, Y29)
	VMOVSS X9, 12(AX)
	VZEROUPPER
	RET

// func dotQ4_Kx2VNNI(w *byte, xq *int8, xd *float32, bs *int16, cols, nb int, out *float32)
// dotQ4_Kx4VNNI for 2 activation rows (a batch with two rows over the
// four- and eight-token kernels): each super-block decoded once for both,
// each token's arithmetic the one-token kernel's. Accumulators: Z0, Z7
// (scaled sums), Y26, Y27 (scaled mins).
TEXT ·dotQ4_Kx2VNNI(SB), NOSPLIT, $0-56
	MOVQ         w+0(FP), DI
	MOVQ         xq+8(FP), SI
	MOVQ         xd+16(FP), DX
	MOVQ         bs+24(FP), R8
	MOVQ         cols+32(FP), R13
	MOVQ         nb+40(FP), CX
	LEAQ         (SI)(R13*1), R9  // token 1 codes
	MOVQ         CX, R11
	SHLQ         $2, R11          // d_x stride in bytes
	SHRQ         $3, R13          // block-sum stride in bytes: cols/16 int16
	MOVL         $0x0F0F0F0F, AX
	VPBROADCASTD AX, Z15
	VMOVDQU64    q4kidx<>+0(SB), Z12
	VMOVDQU64    q4kidx<>+64(SB), Z13
	VMOVDQU64    q4kidx<>+128(SB), Z14
	VMOVDQU64    q4kidx<>+192(SB), Z30
	VMOVDQU      k4minidx<>(SB), Y11
	VXORPS       Z0, Z0, Z0
	VXORPS       Z7, Z7, Z7
	VXORPS       Y26, Y26, Y26
	VXORPS       Y27, Y27, Y27
	TESTQ        CX, CX
	JEQ          q4kx2done

q4kx2loop:
	PREFETCHT0   2112(DI)
	PREFETCHT0   2176(DI)
	PREFETCHT0   2240(DI)
	Q4KUNPACK
	VPERMW       Y1, Y11, Y3 // min pairs
	Q4KPAIR(16, Z16, Z17, Z20, Z21, Z12, Z13)
	Q4KPAIR(80, Z18, Z19, Z22, Z23, Z14, Z30)
	VPBROADCASTW (DI), Y5
	VCVTPH2PS    Y5, Z24      // d_w in 16 lanes
	VPBROADCASTW 2(DI), X5
	VCVTPH2PS    X5, Y25      // dmin in 8 lanes
	Q4KTOKEN(SI, (DX), (R8), Z0, Y26)
	Q4KTOKEN(R9, (DX)(R11*1), (R8)(R13*1), Z7, Y27)
	ADDQ         $144, DI
	ADDQ         $256, SI
	ADDQ         $256, R9
	ADDQ         $4, DX
	ADDQ         $32, R8
	DECQ         CX
	JNZ          q4kx2loop

q4kx2done:
	MOVQ   out+48(FP), AX
	Q4KX4FIN(Z0, Y0, X0, Y26)
	VMOVSS X0, 0(AX)
	Q4KX4FIN(Z7, Y7, X7, Y27)
	VMOVSS X7, 4(AX)
	VZEROUPPER
	RET

// Q6KDEC decodes one 128-value half of a Q6_K super-block (ql at
// qloff(DI), qh at qhoff(DI)) into qa (values 0…63) and qb (64…127), and
// their scale words into sca, scb (ia, ib: the indices of the two parts).
#define Q6KDEC(qloff, qhoff, qa, qb, sca, scb, ia, ib) \
	VMOVDQU64       qloff(DI), qa \
	VPSRLW          $4, qa, qb    \
	VPANDD          Z15, qa, qa   \
	VPANDD          Z15, qb, qb   \
	VBROADCASTI64X4 qhoff(DI), Z9 \
	VPSRLVW         Z13, Z9, Z10  \
	VPSRLVW         Z12, Z9, Z9   \
	VPANDD          Z14, Z10, Z10 \
	VPANDD          Z14, Z9, Z9   \
	VPSLLW          $4, Z10, Z10  \
	VPSLLW          $4, Z9, Z9    \
	VPORD           Z10, qa, qa   \
	VPORD           Z9, qb, qb    \
	VPERMW          Z1, ia, sca   \
	VPERMW          Z1, ib, scb

// Q6KTOKEN adds one token to acc: xp its codes, da its d_x, ba its block
// sums (for the −32 offset).
#define Q6KTOKEN(xp, da, ba, acc) \
	VPMADDWD    ba, Y1, Y6        \
	VPSLLD      $5, Y6, Y6        \
	VPXORD      Z4, Z4, Z4        \
	VPSUBD      Z6, Z4, Z4        \
	VPMADDUBSW  (xp), Z16, Z10    \
	VPDPWSSD    Z20, Z10, Z4      \
	VPMADDUBSW  64(xp), Z17, Z10  \
	VPDPWSSD    Z21, Z10, Z4      \
	VPMADDUBSW  128(xp), Z18, Z10 \
	VPDPWSSD    Z22, Z10, Z4      \
	VPMADDUBSW  192(xp), Z19, Z10 \
	VPDPWSSD    Z23, Z10, Z4      \
	VCVTDQ2PS   Z4, Z4            \
	VMULSS      da, X24, X5       \
	VBROADCASTSS X5, Z5           \
	VFMADD231PS Z5, Z4, acc

// func dotQ6_Kx4VNNI(w *byte, xq *int8, xd *float32, bs *int16, cols, nb int, out *float32)
// dotQ6_KVNNI for 4 activation rows cols codes apart. Accumulators: Z0,
// Z2, Z3, Z7.
TEXT ·dotQ6_Kx4VNNI(SB), NOSPLIT, $0-56
	MOVQ         w+0(FP), DI
	MOVQ         xq+8(FP), SI
	MOVQ         xd+16(FP), DX
	MOVQ         bs+24(FP), R8
	MOVQ         cols+32(FP), R13
	MOVQ         nb+40(FP), CX
	LEAQ         (SI)(R13*1), R9
	LEAQ         (SI)(R13*2), R10
	LEAQ         (R10)(R13*1), BX
	MOVQ         CX, R11
	SHLQ         $2, R11
	LEAQ         (R11)(R11*2), R12
	SHRQ         $3, R13
	MOVL         $0x0F0F0F0F, AX
	VPBROADCASTD AX, Z15
	MOVL         $0x03030303, AX
	VPBROADCASTD AX, Z14
	MOVL         $0x00040004, AX
	VPBROADCASTD AX, Z11
	LEAQ         (R13)(R13*2), AX
	VMOVDQU64    shiftQ6Ka<>(SB), Z13
	VMOVDQU64    shiftQ6Kb<>(SB), Z12
	VMOVDQU64    idxQ6K<>(SB), Z25
	VPADDW       Z11, Z25, Z26 // the scale indices of groups 4–7, 8–11, 12–15
	VPADDW       Z11, Z26, Z27
	VPADDW       Z11, Z27, Z28
	VXORPS       Z0, Z0, Z0
	VXORPS       Z2, Z2, Z2
	VXORPS       Z3, Z3, Z3
	VXORPS       Z7, Z7, Z7
	TESTQ        CX, CX
	JEQ          q6kx4done

q6kx4loop:
	VPMOVSXBW    192(DI), Y1
	Q6KDEC(0, 128, Z16, Z17, Z20, Z21, Z25, Z26)
	Q6KDEC(64, 160, Z18, Z19, Z22, Z23, Z27, Z28)
	VPBROADCASTW 208(DI), Y5
	VCVTPH2PS    Y5, Z24
	Q6KTOKEN(SI, (DX), (R8), Z0)
	Q6KTOKEN(R9, (DX)(R11*1), (R8)(R13*1), Z2)
	Q6KTOKEN(R10, (DX)(R11*2), (R8)(R13*2), Z3)
	Q6KTOKEN(BX, (DX)(R12*1), (R8)(AX*1), Z7)
	ADDQ         $210, DI
	ADDQ         $256, SI
	ADDQ         $256, R9
	ADDQ         $256, R10
	ADDQ         $256, BX
	ADDQ         $4, DX
	ADDQ         $32, R8
	DECQ         CX
	JNZ          q6kx4loop

q6kx4done:
	MOVQ   out+48(FP), AX
	HSUMZ(Z0, Y0, X0)
	VMOVSS X0, 0(AX)
	HSUMZ(Z2, Y2, X2)
	VMOVSS X2, 4(AX)
	HSUMZ(Z3, Y3, X3)
	VMOVSS X3, 8(AX)
	HSUMZ(Z7, Y7, X7)
	VMOVSS X7, 12(AX)
	VZEROUPPER
	RET

// func dotF16SeqAVX512(w *byte, x *float32, n int) float32
// n is a positive multiple of 16. One 16-lane accumulator over the row,
// then _mm512_reduce_add_ps: the arithmetic of llamafile's tinyBLAS, which
// llama.cpp uses for F16 weights whenever the row length is a multiple of
// 16.
TEXT ·dotF16SeqAVX512(SB), NOSPLIT, $0-28
	MOVQ   w+0(FP), DI
	MOVQ   x+8(FP), SI
	MOVQ   n+16(FP), CX
	VXORPS Z0, Z0, Z0

f16seqloop:
	VCVTPH2PS   (DI), Z4
	VFMADD231PS (SI), Z4, Z0
	ADDQ        $32, DI
	ADDQ        $64, SI
	SUBQ        $16, CX
	JNZ         f16seqloop
	HSUM16
	VMOVSS      X0, ret+24(FP)
	VZEROUPPER
	RET

// func dotF32SeqAVX512(w, x *float32, n int) float32
// As dotF16SeqAVX512 for F32 weights (tinyBLAS's F32 path).
TEXT ·dotF32SeqAVX512(SB), NOSPLIT, $0-28
	MOVQ   w+0(FP), DI
	MOVQ   x+8(FP), SI
	MOVQ   n+16(FP), CX
	VXORPS Z0, Z0, Z0

f32seqloop:
	VMOVUPS     (DI), Z4
	VFMADD231PS (SI), Z4, Z0
	ADDQ        $64, DI
	ADDQ        $64, SI
	SUBQ        $16, CX
	JNZ         f32seqloop
	HSUM16
	VMOVSS      X0, ret+24(FP)
	VZEROUPPER
	RET

// func scoresF32AVX512(q, k *float32, stride, n, count int, out *float32)
// out[p] = dotF32AVX512(q, k+p·stride, n) for p < count: the attention
// scores of one query against count keys stride floats apart, with the
// arithmetic of dotF32AVX512 per key. n is a positive multiple of 32,
// count positive.
TEXT ·scoresF32AVX512(SB), NOSPLIT, $0-48
	MOVQ q+0(FP), DI
	MOVQ k+8(FP), SI
	MOVQ stride+16(FP), R9
	MOVQ n+24(FP), R10
	MOVQ count+32(FP), R11
	MOVQ out+40(FP), R12
	SHLQ $2, R9

scoresrow:
	MOVQ   DI, AX
	MOVQ   SI, BX
	MOVQ   R10, CX
	VXORPS Z0, Z0, Z0
	VXORPS Z1, Z1, Z1

scoresloop:
	VMOVUPS     (AX), Z2
	VMOVUPS     64(AX), Z3
	VFMADD231PS (BX), Z2, Z0
	VFMADD231PS 64(BX), Z3, Z1
	ADDQ        $128, AX
	ADDQ        $128, BX
	SUBQ        $32, CX
	JNZ         scoresloop
	VADDPS      Z1, Z0, Z0
	HSUM16
	VMOVSS      X0, (R12)
	ADDQ        $4, R12
	ADDQ        R9, SI
	DECQ        R11
	JNZ         scoresrow
	VZEROUPPER
	RET

// func axpyRowsF32AVX512(o, v *float32, stride, n, count int, e *float32)
// o += e[p]·v[p·stride…] for p < count in order: axpyF32AVX512 once per
// row, each element's fused multiply-adds in the same order, with o kept
// in a register across the rows. n is a positive multiple of 16, count
// positive.
TEXT ·axpyRowsF32AVX512(SB), NOSPLIT, $0-48
	MOVQ o+0(FP), DI
	MOVQ v+8(FP), SI
	MOVQ stride+16(FP), R9
	MOVQ n+24(FP), R10
	MOVQ count+32(FP), R11
	MOVQ e+40(FP), R12
	SHLQ $2, R9

	// 64 columns at a time: four independent chains per row, where one
	// chain at a time would wait on each fused multiply-add.
axpyr64:
	CMPQ    R10, $64
	JLT     axpyrcol
	VMOVUPS (DI), Z1
	VMOVUPS 64(DI), Z2
	VMOVUPS 128(DI), Z3
	VMOVUPS 192(DI), Z4
	MOVQ    SI, BX
	MOVQ    R12, DX
	MOVQ    R11, CX

axpyr64row:
	VBROADCASTSS (DX), Z0
	VFMADD231PS  (BX), Z0, Z1
	VFMADD231PS  64(BX), Z0, Z2
	VFMADD231PS  128(BX), Z0, Z3
	VFMADD231PS  192(BX), Z0, Z4
	ADDQ         $4, DX
	ADDQ         R9, BX
	DECQ         CX
	JNZ          axpyr64row
	VMOVUPS      Z1, (DI)
	VMOVUPS      Z2, 64(DI)
	VMOVUPS      Z3, 128(DI)
	VMOVUPS      Z4, 192(DI)
	ADDQ         $256, DI
	ADDQ         $256, SI
	SUBQ         $64, R10
	JMP          axpyr64

axpyrcol:
	TESTQ   R10, R10
	JEQ     axpyrdone
	VMOVUPS (DI), Z1
	MOVQ    SI, BX
	MOVQ    R12, DX
	MOVQ    R11, CX

axpyrrow:
	VBROADCASTSS (DX), Z0
	VFMADD231PS  (BX), Z0, Z1
	ADDQ         $4, DX
	ADDQ         R9, BX
	DECQ         CX
	JNZ          axpyrrow
	VMOVUPS      Z1, (DI)
	ADDQ         $64, DI
	ADDQ         $64, SI
	SUBQ         $16, R10
	JMP          axpyrcol

axpyrdone:
	VZEROUPPER
	RET

// Index of dword 4k in lane k: picks one group sum per 128-bit lane.
DATA q8kpick<>+0(SB)/4, $0
DATA q8kpick<>+4(SB)/4, $4
DATA q8kpick<>+8(SB)/4, $8
DATA q8kpick<>+12(SB)/4, $12
GLOBL q8kpick<>(SB), RODATA|NOPTR, $16

// AMAX16(off, acc) folds |x| of the 16 floats at off(DI) into acc (Z31:
// the sign mask's complement).
#define AMAX16(off, acc) \
	VANDPS off(DI), Z31, Z8 \
	VMAXPS Z8, acc, acc

// CODES16(k) quantizes the 16 floats at 64k(DI) by Z3 into 16 codes at
// 16k(SI), clamped to 127 as ggml's quantize_row_q8_K does.
#define CODES16(k) \
	VMULPS    (64*k)(DI), Z3, Z4 \
	VCVTPS2DQ Z4, Z4             \
	VPMINSD   Z30, Z4, Z4        \
	VPMOVSDB  Z4, (16*k)(SI)

// BSUMS4(j) writes the sums of the 4 groups of 16 codes at 64j(SI) as 4
// int16 at 8j(R8).
#define BSUMS4(j) \
	VPXORD    Z6, Z6, Z6        \
	VPDPBUSD  (64*j)(SI), Z29, Z6 \
	VPSHUFD   $0x4E, Z6, Z7     \
	VPADDD    Z7, Z6, Z6        \
	VPSHUFD   $0xB1, Z6, Z7     \
	VPADDD    Z7, Z6, Z6        \
	VPERMD    Z6, Z28, Z7       \
	VPMOVDW   X7, (8*j)(R8)

// func quantQ8_KAVX512(x *float32, q *int8, d *float32, bs *int16, nb int)
// quantQ8_KGo's arithmetic on nb blocks of 256 (finite x): the value of
// largest magnitude (the first such) maps to −127, codes
// min(127, round-half-even(x·iscale)), d = 1/iscale, bs the sums of 16.
TEXT ·quantQ8_KAVX512(SB), NOSPLIT, $0-40
	MOVQ         x+0(FP), DI
	MOVQ         q+8(FP), SI
	MOVQ         d+16(FP), DX
	MOVQ         bs+24(FP), R8
	MOVQ         nb+32(FP), CX
	MOVL         $0x7FFFFFFF, AX
	VPBROADCASTD AX, Z31
	MOVL         $127, AX
	VPBROADCASTD AX, Z30
	MOVL         $0x01010101, AX
	VPBROADCASTD AX, Z29
	VMOVDQU32    q8kpick<>(SB), X28
	TESTQ        CX, CX
	JEQ          q8kdone

q8kblock:
	VXORPS Z0, Z0, Z0
	VXORPS Z1, Z1, Z1
	AMAX16(0, Z0)
	AMAX16(64, Z1)
	AMAX16(128, Z0)
	AMAX16(192, Z1)
	AMAX16(256, Z0)
	AMAX16(320, Z1)
	AMAX16(384, Z0)
	AMAX16(448, Z1)
	AMAX16(512, Z0)
	AMAX16(576, Z1)
	AMAX16(640, Z0)
	AMAX16(704, Z1)
	AMAX16(768, Z0)
	AMAX16(832, Z1)
	AMAX16(896, Z0)
	AMAX16(960, Z1)
	VMAXPS        Z1, Z0, Z0
	VEXTRACTF64X4 $1, Z0, Y1
	VMAXPS        Y1, Y0, Y0
	VEXTRACTF128  $1, Y0, X1
	VMAXPS        X1, X0, X0
	VMOVHLPS      X0, X0, X1
	VMAXPS        X1, X0, X0
	VMOVSHDUP     X0, X1
	VMAXSS        X1, X0, X0
	VXORPS        X1, X1, X1
	VUCOMISS      X1, X0
	JEQ           q8kzero

	// The first element whose magnitude is the maximum.
	VBROADCASTSS X0, Z1
	XORQ         BX, BX

q8kfind:
	VANDPS   (DI)(BX*1), Z31, Z8
	VCMPPS   $0, Z1, Z8, K1
	KMOVW    K1, AX
	TESTL    AX, AX
	JNZ      q8kfound
	ADDQ     $64, BX
	CMPQ     BX, $1024
	JLT      q8kfind
	JMP      q8kzero // unreachable for finite x

q8kfound:
	TZCNTL AX, AX
	LEAQ   (DI)(BX*1), R10
	VMOVSS (R10)(AX*4), X2    // mx
	MOVL   $0xC2FE0000, AX    // −127
	VMOVD  AX, X3
	VDIVSS X2, X3, X3         // iscale = −127/mx
	MOVL   $0x3F800000, AX    // 1
	VMOVD  AX, X5
	VDIVSS X3, X5, X5         // d = 1/iscale
	VMOVSS X5, (DX)
	VBROADCASTSS X3, Z3
	CODES16(0)
	CODES16(1)
	CODES16(2)
	CODES16(3)
	CODES16(4)
	CODES16(5)
	CODES16(6)
	CODES16(7)
	CODES16(8)
	CODES16(9)
	CODES16(10)
	CODES16(11)
	CODES16(12)
	CODES16(13)
	CODES16(14)
	CODES16(15)
	BSUMS4(0)
	BSUMS4(1)
	BSUMS4(2)
	BSUMS4(3)
	JMP q8knext

q8kzero:
	VPXORD    Z4, Z4, Z4
	VMOVDQU64 Z4, (SI)
	VMOVDQU64 Z4, 64(SI)
	VMOVDQU64 Z4, 128(SI)
	VMOVDQU64 Z4, 192(SI)
	VMOVDQU64 Y4, (R8)
	MOVL      $0, (DX)

q8knext:
	ADDQ $1024, DI
	ADDQ $256, SI
	ADDQ $4, DX
	ADDQ $32, R8
	DECQ CX
	JNZ  q8kblock

q8kdone:
	VZEROUPPER
	RET

// func quantQ8_0AVX512(x *float32, q *int8, amax *float32, sums *int32, nb int)
// The integer part of quantQ8_0Go on nb blocks of 32 (finite x): amax[b] =
// max|x|, codes round-half-even(x·(127/amax)) (0 where amax is 0) and
// their sum; the f16 scales are left to the caller.
TEXT ·quantQ8_0AVX512(SB), NOSPLIT, $0-40
	MOVQ         x+0(FP), DI
	MOVQ         q+8(FP), SI
	MOVQ         amax+16(FP), DX
	MOVQ         sums+24(FP), R8
	MOVQ         nb+32(FP), CX
	MOVL         $0x7FFFFFFF, AX
	VPBROADCASTD AX, Z31
	MOVL         $0x42FE0000, AX // 127
	VMOVD        AX, X30
	VXORPS       X29, X29, X29
	TESTQ        CX, CX
	JEQ          q80qdone

q80qblock:
	VANDPS        (DI), Z31, Z0
	VANDPS        64(DI), Z31, Z1
	VMAXPS        Z1, Z0, Z0
	VEXTRACTF64X4 $1, Z0, Y1
	VMAXPS        Y1, Y0, Y0
	VEXTRACTF128  $1, Y0, X1
	VMAXPS        X1, X0, X0
	VMOVHLPS      X0, X0, X1
	VMAXPS        X1, X0, X0
	VMOVSHDUP     X0, X1
	VMAXSS        X1, X0, X0
	VMOVSS        X0, (DX)
	VXORPS        X2, X2, X2
	VUCOMISS      X29, X0
	JEQ           q80qscale
	VDIVSS        X0, X30, X2 // id = 127/amax

q80qscale:
	VBROADCASTSS  X2, Z2
	VMULPS        (DI), Z2, Z4
	VMULPS        64(DI), Z2, Z5
	VCVTPS2DQ     Z4, Z4
	VCVTPS2DQ     Z5, Z5
	VPMOVSDB      Z4, (SI)
	VPMOVSDB      Z5, 16(SI)
	VPADDD        Z5, Z4, Z4
	VEXTRACTI64X4 $1, Z4, Y5
	VPADDD        Y5, Y4, Y4
	VEXTRACTI128  $1, Y4, X5
	VPADDD        X5, X4, X4
	VPSHUFD       $0x4E, X4, X5
	VPADDD        X5, X4, X4
	VPSHUFD       $0xB1, X4, X5
	VPADDD        X5, X4, X4
	VMOVD         X4, (R8)
	ADDQ          $128, DI
	ADDQ          $32, SI
	ADDQ          $4, DX
	ADDQ          $4, R8
	DECQ          CX
	JNZ           q80qblock

q80qdone:
	VZEROUPPER
	RET

// R4BLOCK adds to acc row r's block (w at wa, its codes at qa) times the
// activation block in Y9 with scale d_x at da, as BLOCKDOT and BLOCKACC
// do for one row.
#define R4BLOCK(wa, qa, da, acc) \
	VMOVDQU      qa, Y1      \
	VPABSB       Y1, Y3      \
	VPSIGNB      Y1, Y9, Y2  \
	VPXOR        Y4, Y4, Y4  \
	VPDPBUSD     Y2, Y3, Y4  \
	VCVTDQ2PS    Y4, Y4      \
	MOVWLZX      wa, AX      \
	VMOVD        AX, X5      \
	VCVTPH2PS    X5, X5      \
	VMULSS       da, X5, X5  \
	VBROADCASTSS X5, Y5      \
	VFMADD231PS  Y4, Y5, acc

// func dotQ8_0r4VNNI(w *byte, rb int, xq *int8, xd *float32, nb int, out *float32)
// dotQ8_0VNNI for the 4 weight rows at w, w+rb, w+2rb, w+3rb and one
// activation row: each activation block is loaded once, the 4 rows' chains
// are independent (the single-row kernel waits on its one accumulator),
// and every row keeps the single-row arithmetic, so out[r] equals
// dotQ8_0VNNI of row r bit for bit.
TEXT ·dotQ8_0r4VNNI(SB), NOSPLIT, $0-48
	MOVQ   w+0(FP), DI
	MOVQ   rb+8(FP), R9
	MOVQ   xq+16(FP), SI
	MOVQ   xd+24(FP), DX
	MOVQ   nb+32(FP), CX
	LEAQ   (R9)(R9*2), R10
	LEAQ   (DI)(R9*4), R11 // the next 4 rows, swept linearly
	VXORPS Y0, Y0, Y0
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	TESTQ  CX, CX
	JEQ    q80r4done

q80r4loop:
	PREFETCHT0 (R11)
	PREFETCHT0 64(R11)
	PREFETCHT0 128(R11)
	VMOVDQU (SI), Y9
	R4BLOCK((DI), 2(DI), (DX), Y0)
	R4BLOCK((DI)(R9*1), 2(DI)(R9*1), (DX), Y6)
	R4BLOCK((DI)(R9*2), 2(DI)(R9*2), (DX), Y7)
	R4BLOCK((DI)(R10*1), 2(DI)(R10*1), (DX), Y8)
	ADDQ    $34, DI
	ADDQ    $136, R11
	ADDQ    $32, SI
	ADDQ    $4, DX
	DECQ    CX
	JNZ     q80r4loop

q80r4done:
	MOVQ   out+40(FP), AX
	HSUM8(Y0, X0, Y1, X1)
	VMOVSS X0, 0(AX)
	HSUM8(Y6, X6, Y1, X1)
	VMOVSS X6, 4(AX)
	HSUM8(Y7, X7, Y1, X1)
	VMOVSS X7, 8(AX)
	HSUM8(Y8, X8, Y1, X1)
	VMOVSS X8, 12(AX)
	VZEROUPPER
	RET

// Constants of Go's math.Exp on amd64 (its FMA path; exp_amd64.s), which
// EXP8 evaluates for 8 float64 lanes with the same operations in the same
// order, so each lane's result is math.Exp's bit for bit.
DATA expc<>+0(SB)/8, $0.5
DATA expc<>+8(SB)/8, $1.0
DATA expc<>+16(SB)/8, $2.0
DATA expc<>+24(SB)/8, $1.6666666666666666667e-1
DATA expc<>+32(SB)/8, $4.1666666666666666667e-2
DATA expc<>+40(SB)/8, $8.3333333333333333333e-3
DATA expc<>+48(SB)/8, $1.3888888888888888889e-3
DATA expc<>+56(SB)/8, $1.9841269841269841270e-4
DATA expc<>+64(SB)/8, $2.4801587301587301587e-5
DATA expc<>+72(SB)/8, $1.4426950408889634073599246810018920
DATA expc<>+80(SB)/8, $0.69314718055966295651160180568695068359375
DATA expc<>+88(SB)/8, $0.28235290563031577122588448175013436025525412068e-12
DATA expc<>+96(SB)/8, $0.0625
DATA expc<>+104(SB)/8, $700.0
DATA expc<>+112(SB)/8, $1023
GLOBL expc<>(SB), RODATA|NOPTR, $120

// EXP8 replaces the 8 float64 lanes of Z1 (|x| ≤ 700, checked by the
// caller) by exp(x). Scratch: Y4, Z3, Z5, Z6.
#define EXP8 \
	VMULPD.BCST      expc<>+72(SB), Z1, Z3 \
	VCVTPD2DQ        Z3, Y4                \
	VCVTDQ2PD        Y4, Z3                \
	VFNMADD231PD.BCST expc<>+80(SB), Z3, Z1 \
	VFNMADD231PD.BCST expc<>+88(SB), Z3, Z1 \
	VMULPD.BCST      expc<>+96(SB), Z1, Z1 \
	VBROADCASTSD     expc<>+64(SB), Z5     \
	VFMADD213PD.BCST expc<>+56(SB), Z1, Z5 \
	VFMADD213PD.BCST expc<>+48(SB), Z1, Z5 \
	VFMADD213PD.BCST expc<>+40(SB), Z1, Z5 \
	VFMADD213PD.BCST expc<>+32(SB), Z1, Z5 \
	VFMADD213PD.BCST expc<>+24(SB), Z1, Z5 \
	VFMADD213PD.BCST expc<>+0(SB), Z1, Z5  \
	VFMADD213PD.BCST expc<>+8(SB), Z1, Z5  \
	VMULPD           Z5, Z1, Z1            \
	VADDPD.BCST      expc<>+16(SB), Z1, Z5 \
	VMULPD           Z5, Z1, Z1            \
	VADDPD.BCST      expc<>+16(SB), Z1, Z5 \
	VMULPD           Z5, Z1, Z1            \
	VADDPD.BCST      expc<>+16(SB), Z1, Z5 \
	VMULPD           Z5, Z1, Z1            \
	VADDPD.BCST      expc<>+16(SB), Z1, Z5 \
	VFMADD213PD.BCST expc<>+8(SB), Z5, Z1  \
	VPMOVSXDQ        Y4, Z6                \
	VPADDQ.BCST      expc<>+112(SB), Z6, Z6 \
	VPSLLQ           $52, Z6, Z6           \
	VMULPD           Z6, Z1, Z1

// EXPRANGE sets K1 where a lane of Z1 is outside |x| ≤ 700 (or NaN).
#define EXPRANGE \
	VPANDQ.BCST  absmask64<>(SB), Z1, Z3 \
	VCMPPD.BCST  $0x16, expc<>+104(SB), Z3, K1

DATA absmask64<>+0(SB)/8, $0x7FFFFFFFFFFFFFFF
GLOBL absmask64<>(SB), RODATA|NOPTR, $8

// func siluMulAVX512(d, gate, u *float32, n int) int
// d[i] = gate[i] / (1 + float32(math.Exp(float64(−gate[i])))) · u[i], 8 values at a
// time, up to n (a multiple of 8); stops before the first 8 holding a
// value outside the fast range and returns how many it did.
TEXT ·siluMulAVX512(SB), NOSPLIT, $0-40
	MOVQ         d+0(FP), DI
	MOVQ         gate+8(FP), SI
	MOVQ         u+16(FP), DX
	MOVQ         n+24(FP), CX
	XORQ         R9, R9
	MOVL         $0x80000000, AX
	VPBROADCASTD AX, Y7
	MOVL         $0x3F800000, AX
	VPBROADCASTD AX, Y8
	TESTQ        CX, CX
	JEQ          silndone

silnloop:
	VMOVUPS   (SI)(R9*4), Y0
	VXORPS    Y7, Y0, Y2
	VCVTPS2PD Y2, Z1
	EXPRANGE
	KORTESTB  K1, K1
	JNZ       silndone
	EXP8
	VCVTPD2PS Z1, Y1
	VADDPS    Y8, Y1, Y1
	VDIVPS    Y1, Y0, Y0
	VMULPS    (DX)(R9*4), Y0, Y0
	VMOVUPS   Y0, (DI)(R9*4)
	ADDQ      $8, R9
	CMPQ      R9, CX
	JLT       silnloop

silndone:
	MOVQ R9, ret+32(FP)
	VZEROUPPER
	RET

// func expShiftAVX512(x *float32, m float32, n int) int
// x[i] = float32(math.Exp(float64(x[i]−m))) for 8 values at a time, up to
// n (a multiple of 8), stopping as siluMulAVX512 does; returns how many.
TEXT ·expShiftAVX512(SB), NOSPLIT, $0-32
	MOVQ         x+0(FP), DI
	VBROADCASTSS m+8(FP), Y7
	MOVQ         n+16(FP), CX
	XORQ         R9, R9
	TESTQ        CX, CX
	JEQ          expsdone

expsloop:
	VMOVUPS   (DI)(R9*4), Y0
	VSUBPS    Y7, Y0, Y2
	VCVTPS2PD Y2, Z1
	EXPRANGE
	KORTESTB  K1, K1
	JNZ       expsdone
	EXP8
	VCVTPD2PS Z1, Y1
	VMOVUPS   Y1, (DI)(R9*4)
	ADDQ      $8, R9
	CMPQ      R9, CX
	JLT       expsloop

expsdone:
	MOVQ R9, ret+24(FP)
	VZEROUPPER
	RET

// Q4KPAIR8 is Q4KPAIR with the scale indices loaded from q4kidx at
// byte offsets ilo, ihi (through Z10).
#define Q4KPAIR8(qoff, lo, hi, sclo, schi, ilo, ihi) \
	VMOVDQU64 qoff(DI), lo            \
	VPSRLW    $4, lo, hi              \
	VPANDD    Z15, lo, lo             \
	VPANDD    Z15, hi, hi             \
	VMOVDQU64 q4kidx<>+ilo(SB), Z10   \
	VPERMW    Z1, Z10, sclo           \
	VMOVDQU64 q4kidx<>+ihi(SB), Z10   \
	VPERMW    Z1, Z10, schi

// Q4KTOKEN8 is Q4KTOKEN with the scale words in Z28–Z31: x0…x3 the
// addresses of the token's 4 × 64 codes, da its d_x, ba its block sums.
#define Q4KTOKEN8(x0, x1, x2, x3, da, ba, acc, macc) \
	VPMADDUBSW  x0, Z16, Z10      \
	VPMADDWD    Z28, Z10, Z4      \
	VPMADDUBSW  x1, Z17, Z10      \
	VPDPWSSD    Z29, Z10, Z4      \
	VPMADDUBSW  x2, Z18, Z10      \
	VPDPWSSD    Z30, Z10, Z4      \
	VPMADDUBSW  x3, Z19, Z10      \
	VPDPWSSD    Z31, Z10, Z4      \
	VCVTDQ2PS   Z4, Z4            \
	VMULPS.BCST da, Z4, Z4        \
	VFMADD231PS Z24, Z4, acc      \
	VPMADDWD    ba, Y3, Y6        \
	VCVTDQ2PS   Y6, Y6            \
	VMULPS.BCST da, Y6, Y6        \
	VFMADD231PS Y25, Y6, macc

// Q4KFOUR8 runs Q4KTOKEN8 for the 4 tokens at SI, DX, R8 (strides R9,
// R11, R13; R10, R12, AX their triples) into the accumulators given.
#define Q4KFOUR8(a0, m0, a1, m1, a2, m2, a3, m3) \
	Q4KTOKEN8((SI), 64(SI), 128(SI), 192(SI), (DX), (R8), a0, m0) \
	Q4KTOKEN8((SI)(R9*1), 64(SI)(R9*1), 128(SI)(R9*1), 192(SI)(R9*1), (DX)(R11*1), (R8)(R13*1), a1, m1) \
	Q4KTOKEN8((SI)(R9*2), 64(SI)(R9*2), 128(SI)(R9*2), 192(SI)(R9*2), (DX)(R11*2), (R8)(R13*2), a2, m2) \
	Q4KTOKEN8((SI)(R10*1), 64(SI)(R10*1), 128(SI)(R10*1), 192(SI)(R10*1), (DX)(R12*1), (R8)(AX*1), a3, m3)

// Q4KX8OUT finishes one token as Q4KX4FIN does and stores it at off(AX).
#define Q4KX8OUT(acc, macc, off) \
	VMOVAPS acc, Z6                 \
	VMOVAPS macc, Y10               \
	Q4KX4FIN(Z6, Y6, X6, Y10)       \
	VMOVSS  X6, off(AX)

// func dotQ4_Kx8VNNI(w *byte, xq *int8, xd *float32, bs *int16, cols, nb int, out *float32)
// dotQ4_KVNNI for 8 activation rows cols codes apart (the codes in
// q4kOrder): each super-block's nibbles and scales are decoded once for
// the 8 tokens, and every token keeps the one-token arithmetic, so out[k]
// equals dotQ4_KVNNI of token k bit for bit. Accumulators (sums / mins):
// Z0/Y13, Z2/Y14, Z5/Y20, Z7/Y21, Z8/Y22, Z9/Y23, Z11/Y26, Z12/Y27.
TEXT ·dotQ4_Kx8VNNI(SB), NOSPLIT, $16-56
	MOVQ         w+0(FP), DI
	MOVQ         xq+8(FP), SI
	MOVQ         xd+16(FP), DX
	MOVQ         bs+24(FP), R8
	MOVQ         cols+32(FP), R9
	MOVQ         nb+40(FP), CX
	MOVQ         CX, R11
	SHLQ         $2, R11          // d_x stride in bytes
	MOVQ         R9, R13
	SHRQ         $3, R13          // block-sum stride in bytes: cols/16 int16
	LEAQ         (R11*4), AX
	MOVQ         AX, fourd-8(SP)  // 4 token strides of d_x
	LEAQ         (R13*4), AX
	MOVQ         AX, fourbs-16(SP)
	MOVL         $0x0F0F0F0F, AX
	VPBROADCASTD AX, Z15
	LEAQ         (R9)(R9*2), R10  // 3 token strides of codes
	LEAQ         (R11)(R11*2), R12
	LEAQ         (R13)(R13*2), AX
	LEAQ         (R9*4), BX       // 4 token strides of codes
	VXORPS       Z0, Z0, Z0
	VXORPS       Z2, Z2, Z2
	VXORPS       Z5, Z5, Z5
	VXORPS       Z7, Z7, Z7
	VXORPS       Z8, Z8, Z8
	VXORPS       Z9, Z9, Z9
	VXORPS       Z11, Z11, Z11
	VXORPS       Z12, Z12, Z12
	VXORPS       Y13, Y13, Y13
	VXORPS       Y14, Y14, Y14
	VXORPS       Y20, Y20, Y20
	VXORPS       Y21, Y21, Y21
	VXORPS       Y22, Y22, Y22
	VXORPS       Y23, Y23, Y23
	VXORPS       Y26, Y26, Y26
	VXORPS       Y27, Y27, Y27
	TESTQ        CX, CX
	JEQ          q4kx8done

q4kx8loop:
	Q4KUNPACKT(X4, X3)
	VMOVDQU      k4minidx<>(SB), Y4
	VPERMW       Y1, Y4, Y3
	Q4KPAIR8(16, Z16, Z17, Z28, Z29, 0, 64)
	Q4KPAIR8(80, Z18, Z19, Z30, Z31, 128, 192)
	VPBROADCASTW (DI), Y4
	VCVTPH2PS    Y4, Z24
	VPBROADCASTW 2(DI), X4
	VCVTPH2PS    X4, Y25
	Q4KFOUR8(Z0, Y13, Z2, Y14, Z5, Y20, Z7, Y21)
	ADDQ         BX, SI
	ADDQ         fourd-8(SP), DX
	ADDQ         fourbs-16(SP), R8
	Q4KFOUR8(Z8, Y22, Z9, Y23, Z11, Y26, Z12, Y27)
	SUBQ         BX, SI
	SUBQ         fourd-8(SP), DX
	SUBQ         fourbs-16(SP), R8
	ADDQ         $144, DI
	ADDQ         $256, SI
	ADDQ         $4, DX
	ADDQ         $32, R8
	DECQ         CX
	JNZ          q4kx8loop

q4kx8done:
	// Token 2 first: its Z5 is Q4KX4FIN's scratch.
	MOVQ out+48(FP), AX
	Q4KX8OUT(Z5, Y20, 8)
	Q4KX8OUT(Z0, Y13, 0)
	Q4KX8OUT(Z2, Y14, 4)
	Q4KX8OUT(Z7, Y21, 12)
	Q4KX8OUT(Z8, Y22, 16)
	Q4KX8OUT(Z9, Y23, 20)
	Q4KX8OUT(Z11, Y26, 24)
	Q4KX8OUT(Z12, Y27, 28)
	VZEROUPPER
	RET
