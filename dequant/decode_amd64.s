//go:build amd64 && !purego

// AVX2 inner loops for the block types (see decode_amd64.go). Each block
// routine decodes n whole blocks whose scales the Go caller has already
// widened to float32, with exactly the generic code's operations: integer
// code → float32 (exact), then one multiply (and for the types with a min
// or offset one subtract or add) in IEEE single precision, never fused.
// Results are bit-identical to the generic Go decoders.
//
// Only VEX-encoded instructions are used (VMOVD, not MOVD): a legacy SSE
// instruction after a 256-bit one costs a state transition of hundreds of
// cycles on some Intel cores.

#include "textflag.h"

// func lut4AVX2(src *byte, stride int, table *[16]int8, d *float32, dst *float32, n int)
// Decodes n runs of 16 bytes of 4-bit codes, the runs stride bytes apart:
// run i gives 32 outputs, y[j] = table[lo(b[j])]·d[i] and
// y[j+16] = table[hi(b[j])]·d[i]. With the right table this is Q4_0
// (k-8), IQ4_NL, the groups of IQ4_XS, and MXFP4.
TEXT ·lut4AVX2(SB), NOSPLIT, $0-48
	MOVQ src+0(FP), SI
	MOVQ stride+8(FP), R8
	MOVQ table+16(FP), AX
	MOVQ d+24(FP), DX
	MOVQ dst+32(FP), DI
	MOVQ n+40(FP), CX
	VMOVDQU (AX), X13       // the 16 table bytes
	MOVL $0x0F0F0F0F, AX
	VMOVD AX, X15
	VPBROADCASTD X15, X15   // nibble mask
	TESTQ CX, CX
	JEQ lut4done

lut4loop:
	VBROADCASTSS (DX), Y0   // d
	VMOVDQU (SI), X1        // 16 code bytes
	VPAND X15, X1, X2       // low nibbles: elements 0..15
	VPSRLW $4, X1, X3
	VPAND X15, X3, X3       // high nibbles: elements 16..31
	VPSHUFB X2, X13, X2     // table values, int8
	VPSHUFB X3, X13, X3
	VPMOVSXBD X2, Y4        // elements 0..7
	VPSRLDQ $8, X2, X2
	VPMOVSXBD X2, Y5        // 8..15
	VPMOVSXBD X3, Y6        // 16..23
	VPSRLDQ $8, X3, X3
	VPMOVSXBD X3, Y7        // 24..31
	VCVTDQ2PS Y4, Y4
	VCVTDQ2PS Y5, Y5
	VCVTDQ2PS Y6, Y6
	VCVTDQ2PS Y7, Y7
	VMULPS Y0, Y4, Y4       // table[code]·d
	VMULPS Y0, Y5, Y5
	VMULPS Y0, Y6, Y6
	VMULPS Y0, Y7, Y7
	VMOVUPS Y4, (DI)
	VMOVUPS Y5, 32(DI)
	VMOVUPS Y6, 64(DI)
	VMOVUPS Y7, 96(DI)
	ADDQ R8, SI
	ADDQ $4, DX
	ADDQ $128, DI
	DECQ CX
	JNZ lut4loop

lut4done:
	VZEROUPPER
	RET

// func i8AVX2(src *byte, stride int, d *float32, dst *float32, n int)
// Decodes n runs of 32 signed bytes, the runs stride bytes apart:
// y[j] = q[j]·d[i]. Q8_0 and Q8_1 blocks, and Q8_K blocks as 8 runs each.
TEXT ·i8AVX2(SB), NOSPLIT, $0-40
	MOVQ src+0(FP), SI
	MOVQ stride+8(FP), R8
	MOVQ d+16(FP), DX
	MOVQ dst+24(FP), DI
	MOVQ n+32(FP), CX
	TESTQ CX, CX
	JEQ i8done

i8loop:
	VBROADCASTSS (DX), Y0
	VPMOVSXBD (SI), Y4
	VPMOVSXBD 8(SI), Y5
	VPMOVSXBD 16(SI), Y6
	VPMOVSXBD 24(SI), Y7
	VCVTDQ2PS Y4, Y4
	VCVTDQ2PS Y5, Y5
	VCVTDQ2PS Y6, Y6
	VCVTDQ2PS Y7, Y7
	VMULPS Y0, Y4, Y4       // q·d
	VMULPS Y0, Y5, Y5
	VMULPS Y0, Y6, Y6
	VMULPS Y0, Y7, Y7
	VMOVUPS Y4, (DI)
	VMOVUPS Y5, 32(DI)
	VMOVUPS Y6, 64(DI)
	VMOVUPS Y7, 96(DI)
	ADDQ R8, SI
	ADDQ $4, DX
	ADDQ $128, DI
	DECQ CX
	JNZ i8loop

i8done:
	VZEROUPPER
	RET

// Constants for spreading a 32-bit mask over 32 bytes: byte e of the
// result is bit e of the mask. qhShuf copies mask byte e/8 into byte e
// (VPSHUFB works per 128-bit lane, and both lanes hold the broadcast
// mask); qhBits selects bit e%8.
DATA qhShuf<>+0(SB)/8, $0x0000000000000000
DATA qhShuf<>+8(SB)/8, $0x0101010101010101
DATA qhShuf<>+16(SB)/8, $0x0202020202020202
DATA qhShuf<>+24(SB)/8, $0x0303030303030303
GLOBL qhShuf<>(SB), RODATA|NOPTR, $32
DATA qhBits<>+0(SB)/8, $0x8040201008040201
DATA qhBits<>+8(SB)/8, $0x8040201008040201
DATA qhBits<>+16(SB)/8, $0x8040201008040201
DATA qhBits<>+24(SB)/8, $0x8040201008040201
GLOBL qhBits<>(SB), RODATA|NOPTR, $32

// CODES4(q) loads the 16 code bytes at q(SI) as 32 codes in element
// order into Y1: low nibbles (elements 0..15) in the low lane, high
// nibbles (16..31) in the high lane. Y15 = 0x0F bytes.
#define CODES4(q) \
	VMOVDQU q(SI), X1 \
	VPSRLW $4, X1, X2 \
	VPAND X15, X2, X2 \
	VPAND X15, X1, X1 \
	VINSERTI128 $1, X2, Y1, Y1

// HIGH5(qh) ORs the fifth bits, bit e of the little-endian uint32 at
// qh(SI), into byte e of Y1 as 16. Y13 = qhShuf, Y12 = qhBits, Y11 = 0x10
// bytes.
#define HIGH5(qh) \
	VPBROADCASTD qh(SI), Y2 \
	VPSHUFB Y13, Y2, Y2 \
	VPAND Y12, Y2, Y2 \
	VPCMPEQB Y12, Y2, Y2 \
	VPAND Y11, Y2, Y2 \
	VPOR Y2, Y1, Y1

// WIDEN(ext) widens the 32 bytes of Y1 to int32 with ext (VPMOVZXBD or
// VPMOVSXBD) and converts to float32 in Y4, Y5, Y6, Y7 (elements 0..7,
// 8..15, 16..23, 24..31). Order matters: widening into Y6 overwrites X6.
#define WIDEN(ext) \
	ext X1, Y4 \
	VPSRLDQ $8, X1, X5 \
	ext X5, Y5 \
	VEXTRACTI128 $1, Y1, X6 \
	VPSRLDQ $8, X6, X7 \
	ext X6, Y6 \
	ext X7, Y7 \
	VCVTDQ2PS Y4, Y4 \
	VCVTDQ2PS Y5, Y5 \
	VCVTDQ2PS Y6, Y6 \
	VCVTDQ2PS Y7, Y7

#define STORE32 \
	VMOVUPS Y4, (DI) \
	VMOVUPS Y5, 32(DI) \
	VMOVUPS Y6, 64(DI) \
	VMOVUPS Y7, 96(DI)

// MULADD: y = q·d + m with d in Y0, m in Y3 (product rounded first).
#define MULADD \
	VMULPS Y0, Y4, Y4 \
	VMULPS Y0, Y5, Y5 \
	VMULPS Y0, Y6, Y6 \
	VMULPS Y0, Y7, Y7 \
	VADDPS Y3, Y4, Y4 \
	VADDPS Y3, Y5, Y5 \
	VADDPS Y3, Y6, Y6 \
	VADDPS Y3, Y7, Y7

#define MUL \
	VMULPS Y0, Y4, Y4 \
	VMULPS Y0, Y5, Y5 \
	VMULPS Y0, Y6, Y6 \
	VMULPS Y0, Y7, Y7

#define SETUP5 \
	MOVQ src+0(FP), SI \
	MOVQ dm+8(FP), DX \
	MOVQ dst+16(FP), DI \
	MOVQ n+24(FP), CX \
	MOVL $0x0F0F0F0F, AX \
	VMOVD AX, X15 \
	VPBROADCASTD X15, Y15 \
	MOVL $0x10101010, AX \
	VMOVD AX, X11 \
	VPBROADCASTD X11, Y11 \
	VMOVDQU qhShuf<>(SB), Y13 \
	VMOVDQU qhBits<>(SB), Y12

// func q4_1AVX2(src *byte, dm *float32, dst *float32, n int)
// Block: d, m (f16, widened by the caller into dm as d0, m0, d1, m1, …),
// 16 code bytes at byte 4. y = q·d + m.
TEXT ·q4_1AVX2(SB), NOSPLIT, $0-32
	SETUP5
	TESTQ CX, CX
	JEQ q41done

q41loop:
	VBROADCASTSS (DX), Y0
	VBROADCASTSS 4(DX), Y3
	CODES4(4)
	WIDEN(VPMOVZXBD)
	MULADD
	STORE32
	ADDQ $20, SI
	ADDQ $8, DX
	ADDQ $128, DI
	DECQ CX
	JNZ q41loop

q41done:
	VZEROUPPER
	RET

// func q5_0AVX2(src *byte, dm *float32, dst *float32, n int)
// Block: d (widened by the caller into dm), qh uint32 at byte 2, 16 code
// bytes at byte 6. y = (q-16)·d.
TEXT ·q5_0AVX2(SB), NOSPLIT, $0-32
	SETUP5
	TESTQ CX, CX
	JEQ q50done

q50loop:
	VBROADCASTSS (DX), Y0
	CODES4(6)
	HIGH5(2)
	VPSUBB Y11, Y1, Y1      // q - 16, as a signed byte
	WIDEN(VPMOVSXBD)
	MUL
	STORE32
	ADDQ $22, SI
	ADDQ $4, DX
	ADDQ $128, DI
	DECQ CX
	JNZ q50loop

q50done:
	VZEROUPPER
	RET

// func q5_1AVX2(src *byte, dm *float32, dst *float32, n int)
// Block: d, m (widened into dm as for Q4_1), qh uint32 at byte 4, 16 code
// bytes at byte 8. y = q·d + m.
TEXT ·q5_1AVX2(SB), NOSPLIT, $0-32
	SETUP5
	TESTQ CX, CX
	JEQ q51done

q51loop:
	VBROADCASTSS (DX), Y0
	VBROADCASTSS 4(DX), Y3
	CODES4(8)
	HIGH5(4)
	WIDEN(VPMOVZXBD)
	MULADD
	STORE32
	ADDQ $24, SI
	ADDQ $8, DX
	ADDQ $128, DI
	DECQ CX
	JNZ q51loop

q51done:
	VZEROUPPER
	RET

// MULSUB32(Y, X, YD, YM, out) widens the 32 unsigned codes in Y (X is its
// low half) to float32, computes (YD·q) - YM lane by lane and stores the
// 32 results at out(DI).
#define MULSUB32(Y, X, YD, YM, out) \
	VPMOVZXBD X, Y4 \
	VPSRLDQ $8, X, X5 \
	VPMOVZXBD X5, Y5 \
	VEXTRACTI128 $1, Y, X6 \
	VPMOVZXBD X6, Y7 \
	VPSRLDQ $8, X6, X6 \
	VPMOVZXBD X6, Y6 \
	VCVTDQ2PS Y4, Y4 \
	VCVTDQ2PS Y5, Y5 \
	VCVTDQ2PS Y7, Y7 \
	VCVTDQ2PS Y6, Y6 \
	VMULPS YD, Y4, Y4 \
	VMULPS YD, Y5, Y5 \
	VMULPS YD, Y7, Y7 \
	VMULPS YD, Y6, Y6 \
	VSUBPS YM, Y4, Y4 \
	VSUBPS YM, Y5, Y5 \
	VSUBPS YM, Y7, Y7 \
	VSUBPS YM, Y6, Y6 \
	VMOVUPS Y4, out(DI) \
	VMOVUPS Y5, out+32(DI) \
	VMOVUPS Y7, out+64(DI) \
	VMOVUPS Y6, out+96(DI)

// SCALES4K(s) loads the scale and min products of groups 2p and 2p+1,
// where s = 8p is the byte offset of d·sc[2p] in the block's 16 floats.
#define SCALES4K(s) \
	VBROADCASTSS s(DX), Y8 \
	VBROADCASTSS s+4(DX), Y9 \
	VBROADCASTSS s+32(DX), Y10 \
	VBROADCASTSS s+36(DX), Y11

// RUN4K(q, s, out): 32 code bytes at q(SI) hold group 2p (low nibbles)
// and 2p+1 (high nibbles).
#define RUN4K(q, s, out) \
	VMOVDQU q(SI), Y1 \
	VPAND Y15, Y1, Y2 \
	VPSRLW $4, Y1, Y3 \
	VPAND Y15, Y3, Y3 \
	SCALES4K(s) \
	MULSUB32(Y2, X2, Y8, Y10, out) \
	MULSUB32(Y3, X3, Y9, Y11, out+128)

// func q4_KAVX2(src *byte, dm *float32, dst *float32, n int)
// Block: d, dmin, 12 bytes of packed scales (all three widened by the Go
// caller), then 4 runs of 32 code bytes; run p holds group 2p in its low
// nibbles and group 2p+1 in its high nibbles. dm holds, per block, 16
// floats: d·sc[g] for g = 0..7, then dmin·m[g]. y = (d·sc)·q - dmin·m.
TEXT ·q4_KAVX2(SB), NOSPLIT, $0-32
	MOVQ src+0(FP), SI
	MOVQ dm+8(FP), DX
	MOVQ dst+16(FP), DI
	MOVQ n+24(FP), CX
	MOVL $0x0F0F0F0F, AX
	VMOVD AX, X15
	VPBROADCASTD X15, Y15   // nibble mask
	TESTQ CX, CX
	JEQ q4kdone

q4kblock:
	RUN4K(16, 0, 0)
	RUN4K(48, 8, 256)
	RUN4K(80, 16, 512)
	RUN4K(112, 24, 768)
	ADDQ $144, SI
	ADDQ $64, DX
	ADDQ $1024, DI
	DECQ CX
	JNZ q4kblock

q4kdone:
	VZEROUPPER
	RET

// RUN5K(q, lo, hi, s, out): as RUN4K, plus the fifth bits: bit lo (group
// 2p) and bit hi (group 2p+1) of the 32 Qh bytes in Y12 become 16.
#define RUN5K(q, lo, hi, s, out) \
	VMOVDQU q(SI), Y1 \
	VPAND Y15, Y1, Y2 \
	VPSRLW $4, Y1, Y3 \
	VPAND Y15, Y3, Y3 \
	VPSRLW $lo, Y12, Y1 \
	VPAND Y14, Y1, Y1 \
	VPSLLW $4, Y1, Y1 \
	VPOR Y1, Y2, Y2 \
	VPSRLW $hi, Y12, Y1 \
	VPAND Y14, Y1, Y1 \
	VPSLLW $4, Y1, Y1 \
	VPOR Y1, Y3, Y3 \
	SCALES4K(s) \
	MULSUB32(Y2, X2, Y8, Y10, out) \
	MULSUB32(Y3, X3, Y9, Y11, out+128)

// func q5_KAVX2(src *byte, dm *float32, dst *float32, n int)
// Block: d, dmin, scales (widened by the caller into dm as for Q4_K),
// Qh[32] at byte 16, 4 runs of 32 code bytes from byte 48. The fifth bit
// of element l of group g is bit g of Qh[l].
TEXT ·q5_KAVX2(SB), NOSPLIT, $0-32
	MOVQ src+0(FP), SI
	MOVQ dm+8(FP), DX
	MOVQ dst+16(FP), DI
	MOVQ n+24(FP), CX
	MOVL $0x0F0F0F0F, AX
	VMOVD AX, X15
	VPBROADCASTD X15, Y15   // nibble mask
	MOVL $0x01010101, AX
	VMOVD AX, X14
	VPBROADCASTD X14, Y14   // bit 0 of every byte
	TESTQ CX, CX
	JEQ q5kdone

q5kblock:
	VMOVDQU 16(SI), Y12     // Qh
	RUN5K(48, 0, 1, 0, 0)
	RUN5K(80, 2, 3, 8, 256)
	RUN5K(112, 4, 5, 16, 512)
	RUN5K(144, 6, 7, 24, 768)
	ADDQ $176, SI
	ADDQ $64, DX
	ADDQ $1024, DI
	DECQ CX
	JNZ q5kblock

q5kdone:
	VZEROUPPER
	RET

// DECODE6(s1, s2, out) widens the 32 signed codes in Y1 (already q-32) to
// float32, multiplies elements 0..15 by the float at s1(DX) and 16..31 by
// the float at s2(DX), and stores the 32 results at out(DI).
#define DECODE6(s1, s2, out) \
	VBROADCASTSS s1(DX), Y8 \
	VBROADCASTSS s2(DX), Y9 \
	VPMOVSXBD X1, Y4 \
	VPSRLDQ $8, X1, X5 \
	VPMOVSXBD X5, Y5 \
	VEXTRACTI128 $1, Y1, X6 \
	VPMOVSXBD X6, Y7 \
	VPSRLDQ $8, X6, X6 \
	VPMOVSXBD X6, Y6 \
	VCVTDQ2PS Y4, Y4 \
	VCVTDQ2PS Y5, Y5 \
	VCVTDQ2PS Y7, Y7 \
	VCVTDQ2PS Y6, Y6 \
	VMULPS Y8, Y4, Y4 \
	VMULPS Y8, Y5, Y5 \
	VMULPS Y9, Y7, Y7 \
	VMULPS Y9, Y6, Y6 \
	VMOVUPS Y4, out(DI) \
	VMOVUPS Y5, out+32(DI) \
	VMOVUPS Y7, out+64(DI) \
	VMOVUPS Y6, out+96(DI)

// HALF6(ql, qh, s, out) decodes one 128-element half of a Q6_K block: ql
// and qh are the byte offsets of its 64 low-nibble and 32 high-bit bytes
// from SI, s the byte offset of its first of 8 scale products from DX,
// out the byte offset of its first output from DI. Y15 = 0x0F bytes,
// Y14 = 0x03 bytes, Y13 = 0x20 (32) bytes.
#define HALF6(ql, qh, s, out) \
	VMOVDQU ql(SI), Y10 \
	VMOVDQU ql+32(SI), Y11 \
	VMOVDQU qh(SI), Y12 \
	VPAND Y15, Y10, Y1 \
	VPAND Y14, Y12, Y2 \
	VPSLLW $4, Y2, Y2 \
	VPOR Y2, Y1, Y1 \
	VPSUBB Y13, Y1, Y1 \
	DECODE6(s, s+4, out) \
	VPAND Y15, Y11, Y1 \
	VPSRLW $2, Y12, Y2 \
	VPAND Y14, Y2, Y2 \
	VPSLLW $4, Y2, Y2 \
	VPOR Y2, Y1, Y1 \
	VPSUBB Y13, Y1, Y1 \
	DECODE6(s+8, s+12, out+128) \
	VPSRLW $4, Y10, Y1 \
	VPAND Y15, Y1, Y1 \
	VPSRLW $4, Y12, Y2 \
	VPAND Y14, Y2, Y2 \
	VPSLLW $4, Y2, Y2 \
	VPOR Y2, Y1, Y1 \
	VPSUBB Y13, Y1, Y1 \
	DECODE6(s+16, s+20, out+256) \
	VPSRLW $4, Y11, Y1 \
	VPAND Y15, Y1, Y1 \
	VPSRLW $6, Y12, Y2 \
	VPAND Y14, Y2, Y2 \
	VPSLLW $4, Y2, Y2 \
	VPOR Y2, Y1, Y1 \
	VPSUBB Y13, Y1, Y1 \
	DECODE6(s+24, s+28, out+384)

// func q6_KAVX2(src *byte, ds *float32, dst *float32, n int)
// Block: ql[128], qh[64], scales[16] (skipped), d (skipped); ds holds, per
// block, the 16 products d·scale[g]. In half h (ql = 64 bytes from 64h,
// qh = 32 bytes from 128+32h), for l = 0..31:
//   q[l]    = lo(ql[l])    | (qh[l]&3)<<4
//   q[l+32] = lo(ql[l+32]) | (qh[l]>>2&3)<<4
//   q[l+64] = hi(ql[l])    | (qh[l]>>4&3)<<4
//   q[l+96] = hi(ql[l+32]) | (qh[l]>>6&3)<<4
// and y = (d·scale)·(q-32), with q-32 formed as a signed byte.
TEXT ·q6_KAVX2(SB), NOSPLIT, $0-32
	MOVQ src+0(FP), SI
	MOVQ ds+8(FP), DX
	MOVQ dst+16(FP), DI
	MOVQ n+24(FP), CX
	MOVL $0x0F0F0F0F, AX
	VMOVD AX, X15
	VPBROADCASTD X15, Y15
	MOVL $0x03030303, AX
	VMOVD AX, X14
	VPBROADCASTD X14, Y14
	MOVL $0x20202020, AX
	VMOVD AX, X13
	VPBROADCASTD X13, Y13
	TESTQ CX, CX
	JEQ q6kdone

q6kblock:
	HALF6(0, 128, 0, 0)
	HALF6(64, 160, 32, 512)
	ADDQ $210, SI
	ADDQ $64, DX
	ADDQ $1024, DI
	DECQ CX
	JNZ q6kblock

q6kdone:
	VZEROUPPER
	RET

// MULSUB2X16(YD1, YM1, YD2, YM2, ext, out) widens the 32 codes in Y1 with
// ext and stores (YD1·q) - YM1 for elements 0..15 and (YD2·q) - YM2 for
// elements 16..31 at out(DI).
#define MULSUB2X16(YD1, YM1, YD2, YM2, ext, out) \
	WIDEN(ext) \
	VMULPS YD1, Y4, Y4 \
	VMULPS YD1, Y5, Y5 \
	VMULPS YD2, Y6, Y6 \
	VMULPS YD2, Y7, Y7 \
	VSUBPS YM1, Y4, Y4 \
	VSUBPS YM1, Y5, Y5 \
	VSUBPS YM2, Y6, Y6 \
	VSUBPS YM2, Y7, Y7 \
	VMOVUPS Y4, out(DI) \
	VMOVUPS Y5, out+32(DI) \
	VMOVUPS Y6, out+64(DI) \
	VMOVUPS Y7, out+96(DI)

// RUN2K(q, sh, g, out): the 32 elements at bit shift sh of the 32 code
// bytes at q(SI); their groups are g and g+1 (g = byte offset 4g into the
// block's dl floats, whose ml floats follow 64 bytes later).
#define RUN2K(q, sh, g, out) \
	VMOVDQU q(SI), Y1 \
	VPSRLW $sh, Y1, Y1 \
	VPAND Y14, Y1, Y1 \
	VBROADCASTSS g(DX), Y8 \
	VBROADCASTSS g+4(DX), Y9 \
	VBROADCASTSS g+64(DX), Y10 \
	VBROADCASTSS g+68(DX), Y11 \
	MULSUB2X16(Y8, Y10, Y9, Y11, VPMOVZXBD, out)

// func q2_KAVX2(src *byte, dm *float32, dst *float32, n int)
// Block: scales[16], qs[64] at byte 16, d, dmin (all widened by the caller:
// per block dm holds d·lo(scales[g]) for g = 0..15, then dmin·hi(scales[g])).
// Element 128h+32s+l is bits 2s..2s+1 of qs[32h+l]; y = dl·q - ml.
TEXT ·q2_KAVX2(SB), NOSPLIT, $0-32
	MOVQ src+0(FP), SI
	MOVQ dm+8(FP), DX
	MOVQ dst+16(FP), DI
	MOVQ n+24(FP), CX
	MOVL $0x03030303, AX
	VMOVD AX, X14
	VPBROADCASTD X14, Y14   // 2-bit mask
	TESTQ CX, CX
	JEQ q2kdone

q2kblock:
	RUN2K(16, 0, 0, 0)
	RUN2K(16, 2, 8, 128)
	RUN2K(16, 4, 16, 256)
	RUN2K(16, 6, 24, 384)
	RUN2K(48, 0, 32, 512)
	RUN2K(48, 2, 40, 640)
	RUN2K(48, 4, 48, 768)
	RUN2K(48, 6, 56, 896)
	ADDQ $84, SI
	ADDQ $128, DX
	ADDQ $1024, DI
	DECQ CX
	JNZ q2kblock

q2kdone:
	VZEROUPPER
	RET

// RUN3K(q, sh, hb, g, out): low 2 bits at shift sh of the 32 code bytes at
// q(SI), third bit = bit hb of the 32 hmask bytes in Y12; code-4 becomes a
// signed byte; groups g, g+1 (byte offsets into the block's 16 floats).
#define RUN3K(q, sh, hb, g, out) \
	VMOVDQU q(SI), Y1 \
	VPSRLW $sh, Y1, Y1 \
	VPAND Y14, Y1, Y1 \
	VPSRLW $hb, Y12, Y2 \
	VPAND Y13, Y2, Y2 \
	VPSLLW $2, Y2, Y2 \
	VPOR Y2, Y1, Y1 \
	VPSUBB Y11, Y1, Y1 \
	VBROADCASTSS g(DX), Y8 \
	VBROADCASTSS g+4(DX), Y9 \
	WIDEN(VPMOVSXBD) \
	VMULPS Y8, Y4, Y4 \
	VMULPS Y8, Y5, Y5 \
	VMULPS Y9, Y6, Y6 \
	VMULPS Y9, Y7, Y7 \
	VMOVUPS Y4, out(DI) \
	VMOVUPS Y5, out+32(DI) \
	VMOVUPS Y6, out+64(DI) \
	VMOVUPS Y7, out+96(DI)

// func q3_KAVX2(src *byte, ds *float32, dst *float32, n int)
// Block: hmask[32], qs[64] at byte 32, scales, d (widened by the caller:
// ds holds d·(scale[g]-32) per group). Element 128h+32s+l: low bits
// 2s..2s+1 of qs[32h+l], third bit = bit 4h+s of hmask[l] (clear means
// minus 4); y = ds[g]·(code-4).
TEXT ·q3_KAVX2(SB), NOSPLIT, $0-32
	MOVQ src+0(FP), SI
	MOVQ ds+8(FP), DX
	MOVQ dst+16(FP), DI
	MOVQ n+24(FP), CX
	MOVL $0x03030303, AX
	VMOVD AX, X14
	VPBROADCASTD X14, Y14   // 2-bit mask
	MOVL $0x01010101, AX
	VMOVD AX, X13
	VPBROADCASTD X13, Y13   // bit 0 of every byte
	MOVL $0x04040404, AX
	VMOVD AX, X11
	VPBROADCASTD X11, Y11   // 4 in every byte
	TESTQ CX, CX
	JEQ q3kdone

q3kblock:
	VMOVDQU (SI), Y12       // hmask
	RUN3K(32, 0, 0, 0, 0)
	RUN3K(32, 2, 1, 8, 128)
	RUN3K(32, 4, 2, 16, 256)
	RUN3K(32, 6, 3, 24, 384)
	RUN3K(64, 0, 4, 32, 512)
	RUN3K(64, 2, 5, 40, 640)
	RUN3K(64, 4, 6, 48, 768)
	RUN3K(64, 6, 7, 56, 896)
	ADDQ $110, SI
	ADDQ $64, DX
	ADDQ $1024, DI
	DECQ CX
	JNZ q3kblock

q3kdone:
	VZEROUPPER
	RET

// func f16ToF32F16C(src *byte, dst *float32, n int)
// Widens n (a multiple of 8) little-endian halves to float32 with F16C's
// VCVTPH2PS, which is exact (a signalling NaN comes back quiet).
TEXT ·f16ToF32F16C(SB), NOSPLIT, $0-24
	MOVQ src+0(FP), SI
	MOVQ dst+8(FP), DI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	JEQ h2fdone

h2floop:
	VCVTPH2PS (SI), Y0
	VMOVUPS Y0, (DI)
	ADDQ $16, SI
	ADDQ $32, DI
	DECQ CX
	JNZ h2floop

h2fdone:
	VZEROUPPER
	RET

// func f32ToF16F16C(src *float32, dst *uint16, n int) (nan bool)
// Narrows n (a multiple of 8) float32 values to halves with VCVTPS2PH,
// rounding to nearest even (immediate 0), which matches F32ToF16 for every
// input but NaN; it reports whether any input was NaN so the caller can
// rewrite those elements the portable way.
TEXT ·f32ToF16F16C(SB), NOSPLIT, $0-25
	MOVQ src+0(FP), SI
	MOVQ dst+8(FP), DI
	MOVQ n+16(FP), CX
	VPXOR Y3, Y3, Y3        // NaN lanes seen
	SHRQ $3, CX
	JEQ f2hdone

f2hloop:
	VMOVUPS (SI), Y0
	VCVTPS2PH $0, Y0, X1
	VMOVDQU X1, (DI)
	VCMPPS $3, Y0, Y0, Y2   // unordered: NaN
	VORPS Y2, Y3, Y3
	ADDQ $32, SI
	ADDQ $16, DI
	DECQ CX
	JNZ f2hloop

f2hdone:
	VMOVMSKPS Y3, AX
	TESTL AX, AX
	SETNE nan+24(FP)
	VZEROUPPER
	RET

// func bf16ToF32AVX2(src *byte, dst *float32, n int)
// Widens n (a multiple of 8) bfloat16 values: each is the top half of
// its float32.
TEXT ·bf16ToF32AVX2(SB), NOSPLIT, $0-24
	MOVQ src+0(FP), SI
	MOVQ dst+8(FP), DI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	JEQ bf2fdone

bf2floop:
	VPMOVZXWD (SI), Y0
	VPSLLD $16, Y0, Y0
	VMOVDQU Y0, (DI)
	ADDQ $16, SI
	ADDQ $32, DI
	DECQ CX
	JNZ bf2floop

bf2fdone:
	VZEROUPPER
	RET
