package dequant

import (
	"math"

	"github.com/forge-llm/forge/gguf"
)

// Reference quantizers for Q2_K to Q6_K: ggml's quantize_row_q*_K_ref (the path llama-quantize takes without an
// importance matrix). Each 16- or 32-element group gets its own scale (and
// min) by a small search that minimises weighted squared error; the group
// scales are then quantized to 6 or 8 bits against one f16 super-block
// scale, and the elements are re-quantized against the rounded scales.

func init() {
	encoders[gguf.TypeQ2_K] = encodeQ2_K
	encoders[gguf.TypeQ3_K] = encodeQ3_K
	encoders[gguf.TypeQ4_K] = encodeQ4_K
	encoders[gguf.TypeQ5_K] = encodeQ5_K
	encoders[gguf.TypeQ6_K] = encodeQ6_K
}

// groupMaxEps is ggml's GROUP_MAX_EPS: groups with max|x| below it are
// treated as all zero.
const groupMaxEps = 1e-15

func absF32(f float32) float32 { return math.Float32frombits(math.Float32bits(f) &^ (1 << 31)) }

func sqrtF32(f float32) float32 { return float32(math.Sqrt(float64(f))) }

// makeQKX2Quants is ggml's make_qkx2_quants: it fits x ≈ scale·L - theMin
// with L in [0, nmax], trying nstep+1 candidate inverse scales
// (nmax + rmin + rdelta·is)/(max-min) and, for each, the weighted
// least-squares scale and min for those codes, keeping the candidate with
// the smallest weighted squared error (absolute error when useMAD). It
// returns the scale, writes the codes to L and the (non-negative) min.
func makeQKX2Quants(nmax int, x, weights []float32, L, laux []uint8, rmin, rdelta float32, nstep int, useMAD bool) (scale, theMin float32) {
	n := len(x)
	lo, hi := x[0], x[0]
	sumW := weights[0]
	sumX := sumW * x[0]
	for i := 1; i < n; i++ {
		if x[i] < lo {
			lo = x[i]
		}
		if x[i] > hi {
			hi = x[i]
		}
		w := weights[i]
		sumW += w
		sumX += float32(w * x[i])
	}
	if lo > 0 {
		lo = 0
	}
	if hi == lo {
		for i := range L[:n] {
			L[i] = 0
		}
		return 0, -lo
	}
	fnmax := float32(nmax)
	iscale := fnmax / (hi - lo)
	scale = 1 / iscale
	var bestError float32
	for i := 0; i < n; i++ {
		l := nearestInt(iscale * (x[i] - lo))
		L[i] = uint8(max(0, min(int32(nmax), l)))
		diff := float32(scale*float32(L[i])) + lo - x[i]
		bestError += float32(weights[i] * errTerm(diff, useMAD))
	}
	if nstep < 1 {
		return scale, -lo
	}
	for is := 0; is <= nstep; is++ {
		iscale = (rmin + float32(rdelta*float32(is)) + fnmax) / (hi - lo)
		var sumL, sumL2, sumXL float32
		for i := 0; i < n; i++ {
			l := nearestInt(iscale * (x[i] - lo))
			l = max(0, min(int32(nmax), l))
			laux[i] = uint8(l)
			w := weights[i]
			fl := float32(l)
			sumL += float32(w * fl)
			sumL2 += float32(w * fl * fl)
			sumXL += float32(w * fl * x[i])
		}
		D := float32(sumW*sumL2) - float32(sumL*sumL)
		if D > 0 {
			thisScale := (float32(sumW*sumXL) - float32(sumX*sumL)) / D
			thisMin := (float32(sumL2*sumX) - float32(sumL*sumXL)) / D
			if thisMin > 0 {
				thisMin = 0
				thisScale = sumXL / sumL2
			}
			var curError float32
			for i := 0; i < n; i++ {
				diff := float32(thisScale*float32(laux[i])) + thisMin - x[i]
				curError += float32(weights[i] * errTerm(diff, useMAD))
			}
			if curError < bestError {
				copy(L[:n], laux[:n])
				bestError = curError
				scale = thisScale
				lo = thisMin
			}
		}
	}
	return scale, -lo
}

// errTerm is |diff| or diff², as make_qkx2_quants's use_mad selects.
func errTerm(diff float32, useMAD bool) float32 {
	if useMAD {
		return absF32(diff)
	}
	return diff * diff
}

// makeQXQuants is ggml's make_qx_quants with rmse_type 1 and no importance
// weights (weights x²): symmetric codes L in [0, 2·nmax) representing
// L-nmax, first with iscale = -nmax/max, then 18 nearby inverse scales,
// keeping the one whose least-squares scale explains the most weighted
// energy. Returns the scale.
func makeQXQuants(nmax int, x []float32, L []int8) float32 {
	var amax, maxv float32
	for _, v := range x {
		if a := absF32(v); a > amax {
			amax, maxv = a, v
		}
	}
	if amax < groupMaxEps {
		for i := range L[:len(x)] {
			L[i] = 0
		}
		return 0
	}
	fnmax := float32(nmax)
	lo, hi := int32(-nmax), int32(nmax-1)
	iscale := float32(-nmax) / maxv
	var sumLX, sumL2 float32
	for i, v := range x {
		l := max(lo, min(hi, nearestInt(iscale*v)))
		L[i] = int8(l + int32(nmax))
		w := v * v
		fl := float32(l)
		sumLX += float32(w * v * fl)
		sumL2 += float32(w * fl * fl)
	}
	var scale float32
	if sumL2 != 0 {
		scale = sumLX / sumL2
	}
	best := scale * sumLX
	for is := -9; is <= 9; is++ {
		if is == 0 {
			continue
		}
		iscale = -(fnmax + float32(0.1*float32(is))) / maxv
		sumLX, sumL2 = 0, 0
		for _, v := range x {
			l := max(lo, min(hi, nearestInt(iscale*v)))
			w := v * v
			fl := float32(l)
			sumLX += float32(w * v * fl)
			sumL2 += float32(w * fl * fl)
		}
		if sumL2 > 0 && float32(sumLX*sumLX) > float32(best*sumL2) {
			for i, v := range x {
				l := max(lo, min(hi, nearestInt(iscale*v)))
				L[i] = int8(l + int32(nmax))
			}
			scale = sumLX / sumL2
			best = scale * sumLX
		}
	}
	return scale
}

// packScaleMinK4 stores 6-bit scale ls and min lm of group j into the 12
// packed bytes of a Q4_K/Q5_K block (the inverse of scaleMinK4). Groups
// 4..7 must be written after groups 0..3, whose bytes they share.
func packScaleMinK4(j int, ls, lm uint8, s *[12]byte) {
	if j < 4 {
		s[j] = ls
		s[j+4] = lm
		return
	}
	s[j+4] = ls&0xf | (lm&0xf)<<4
	s[j-4] |= (ls >> 4) << 6
	s[j] |= (lm >> 4) << 6
}

// quantizeKScalesMins is the part shared by Q4_K and Q5_K: per 32-element
// group, fit scale and min (weights: RMS of the group + |x|), quantize the
// 8 scales and 8 mins to 6 bits, store them with d and dmin, then
// re-quantize every element to [0, nmax] against the rounded values.
func quantizeKScalesMins(x *[256]float32, nmax int, rmin, rdelta float32, nstep int, scalesOut *[12]byte, dOut, dminOut []byte, L *[256]uint8) {
	var scales, mins [8]float32
	var weights [32]float32
	var laux [32]uint8
	var maxScale, maxMin float32
	for j := 0; j < 8; j++ {
		xg := x[32*j : 32*j+32]
		var sumX2 float32
		for _, v := range xg {
			sumX2 += float32(v * v)
		}
		avX := sqrtF32(sumX2 / 32)
		for l, v := range xg {
			weights[l] = avX + absF32(v)
		}
		scales[j], mins[j] = makeQKX2Quants(nmax, xg, weights[:], L[32*j:32*j+32], laux[:], rmin, rdelta, nstep, false)
		maxScale = max(maxScale, scales[j])
		maxMin = max(maxMin, mins[j])
	}
	var invScale, invMin float32
	if maxScale > 0 {
		invScale = 63 / maxScale
	}
	if maxMin > 0 {
		invMin = 63 / maxMin
	}
	*scalesOut = [12]byte{}
	for j := 0; j < 8; j++ {
		ls := min(63, uint8(nearestInt(invScale*scales[j])))
		lm := min(63, uint8(nearestInt(invMin*mins[j])))
		packScaleMinK4(j, ls, lm, scalesOut)
	}
	putF16(dOut, maxScale/63)
	putF16(dminOut, maxMin/63)
	d, dmin := f16(dOut), f16(dminOut)
	for j := 0; j < 8; j++ {
		sc, m := scaleMinK4(j, scalesOut)
		dj := d * float32(sc)
		if dj == 0 {
			continue // keep the codes from the fit
		}
		dm := dmin * float32(m)
		for ii := 0; ii < 32; ii++ {
			l := nearestInt((x[32*j+ii] + dm) / dj)
			L[32*j+ii] = uint8(max(0, min(int32(nmax), l)))
		}
	}
}

func encodeQ4_K(src []float32, dst []byte) {
	const bb, bs = 144, 256
	var L [256]uint8
	for i := 0; i < len(src)/bs; i++ {
		x := (*[bs]float32)(src[i*bs:])
		b := (*[bb]byte)(dst[i*bb:])
		quantizeKScalesMins(x, 15, -1, 0.1, 20, (*[12]byte)(b[4:16]), b[0:2], b[2:4], &L)
		for p := 0; p < 4; p++ {
			for l := 0; l < 32; l++ {
				b[16+32*p+l] = L[64*p+l] | L[64*p+l+32]<<4
			}
		}
	}
}

func encodeQ5_K(src []float32, dst []byte) {
	const bb, bs = 176, 256
	var L [256]uint8
	for i := 0; i < len(src)/bs; i++ {
		x := (*[bs]float32)(src[i*bs:])
		b := (*[bb]byte)(dst[i*bb:])
		quantizeKScalesMins(x, 31, -0.5, 0.1, 15, (*[12]byte)(b[4:16]), b[0:2], b[2:4], &L)
		qh := (*[32]byte)(b[16:48])
		*qh = [32]byte{}
		for p := 0; p < 4; p++ {
			m1, m2 := byte(1)<<(2*p), byte(2)<<(2*p)
			for j := 0; j < 32; j++ {
				l1, l2 := L[64*p+j], L[64*p+j+32]
				if l1 > 15 {
					l1 -= 16
					qh[j] |= m1
				}
				if l2 > 15 {
					l2 -= 16
					qh[j] |= m2
				}
				b[48+32*p+j] = l1 | l2<<4
			}
		}
	}
}

func encodeQ6_K(src []float32, dst []byte) {
	const bb, bs = 210, 256
	var L [256]int8
	var scales [16]float32
	for i := 0; i < len(src)/bs; i++ {
		x := (*[bs]float32)(src[i*bs:])
		b := (*[bb]byte)(dst[i*bb:])
		var maxScale, maxAbsScale float32
		for g := 0; g < 16; g++ {
			s := makeQXQuants(32, x[16*g:16*g+16], L[16*g:16*g+16])
			scales[g] = s
			if a := absF32(s); a > maxAbsScale {
				maxAbsScale, maxScale = a, s
			}
		}
		if maxAbsScale < groupMaxEps {
			clear(b[:])
			continue
		}
		iscale := -128 / maxScale
		putF16(b[208:210], 1/iscale)
		d := f16(b[208:210])
		for g := 0; g < 16; g++ {
			b[192+g] = byte(int8(min(127, nearestInt(iscale*scales[g]))))
		}
		for g := 0; g < 16; g++ {
			dg := d * float32(int8(b[192+g]))
			if dg == 0 {
				continue
			}
			for ii := 0; ii < 16; ii++ {
				l := nearestInt(x[16*g+ii] / dg)
				L[16*g+ii] = int8(max(-32, min(31, l)) + 32)
			}
		}
		for h := 0; h < 2; h++ {
			ql := (*[64]byte)(b[64*h:])
			qh := (*[32]byte)(b[128+32*h:])
			Lh := (*[128]int8)(L[128*h:])
			for l := 0; l < 32; l++ {
				q1, q2, q3, q4 := uint8(Lh[l]), uint8(Lh[l+32]), uint8(Lh[l+64]), uint8(Lh[l+96])
				ql[l] = q1&0xf | (q3&0xf)<<4
				ql[l+32] = q2&0xf | (q4&0xf)<<4
				qh[l] = q1>>4 | (q2>>4)<<2 | (q3>>4)<<4 | (q4>>4)<<6
			}
		}
	}
}

// makeQ3Quants is ggml's make_q3_quants with do_rmse: symmetric codes in
// [-nmax, nmax) fitted by weighted (x²) least squares, then up to 5 passes
// that move single codes while that raises the explained energy. Codes
// are written to L offset by nmax; returns the scale.
func makeQ3Quants(nmax int, x []float32, L []int8) float32 {
	var amax, maxv float32
	for _, v := range x {
		if a := absF32(v); a > amax {
			amax, maxv = a, v
		}
	}
	if amax < groupMaxEps {
		for i := range L[:len(x)] {
			L[i] = 0
		}
		return 0
	}
	lo, hi := int32(-nmax), int32(nmax-1)
	iscale := float32(-nmax) / maxv
	var sumLX, sumL2 float32
	for i, v := range x {
		l := max(lo, min(hi, nearestInt(iscale*v)))
		L[i] = int8(l)
		w := v * v
		sumLX += float32(w * v * float32(l))
		sumL2 += float32(w * float32(l) * float32(l))
	}
	for itry := 0; itry < 5; itry++ {
		changed := 0
		for i, v := range x {
			w := v * v
			fl := float32(L[i])
			slx := sumLX - float32(w*v*fl)
			if slx > 0 {
				sl2 := sumL2 - float32(w*fl*fl)
				newL := max(lo, min(hi, nearestInt(v*sl2/slx)))
				if newL != int32(L[i]) {
					fn := float32(newL)
					slx += float32(w * v * fn)
					sl2 += float32(w * fn * fn)
					if sl2 > 0 && float32(slx*slx*sumL2) > float32(sumLX*sumLX*sl2) {
						L[i] = int8(newL)
						sumLX, sumL2 = slx, sl2
						changed++
					}
				}
			}
		}
		if changed == 0 {
			break
		}
	}
	for i := range L[:len(x)] {
		L[i] += int8(nmax)
	}
	if sumL2 > 0 {
		return sumLX / sumL2
	}
	return 0
}

// pack2Bit stores 256 2-bit codes the Q2_K/Q3_K way: element 128h+32s+l
// in bits 2s..2s+1 of qs[32h+l].
func pack2Bit(L *[256]uint8, qs *[64]byte) {
	for h := 0; h < 2; h++ {
		for l := 0; l < 32; l++ {
			j := 128*h + l
			qs[32*h+l] = L[j] | L[j+32]<<2 | L[j+64]<<4 | L[j+96]<<6
		}
	}
}

// encodeQ2_K: per 16-element group, fit scale and min (weights |x|,
// mean absolute error), quantize both to 4 bits against d and dmin, then
// re-quantize the elements to [0, 3].
func encodeQ2_K(src []float32, dst []byte) {
	const bb, bs = 84, 256
	var L [256]uint8
	var laux [16]uint8
	var weights [16]float32
	var scales, mins [16]float32
	for i := 0; i < len(src)/bs; i++ {
		x := (*[bs]float32)(src[i*bs:])
		b := (*[bb]byte)(dst[i*bb:])
		var maxScale, maxMin float32
		for j := 0; j < 16; j++ {
			xg := x[16*j : 16*j+16]
			for l, v := range xg {
				weights[l] = absF32(v)
			}
			scales[j], mins[j] = makeQKX2Quants(3, xg, weights[:], L[16*j:16*j+16], laux[:], -0.5, 0.1, 15, true)
			maxScale = max(maxScale, scales[j])
			maxMin = max(maxMin, mins[j])
		}
		sc := (*[16]byte)(b[0:16])
		if maxScale > 0 {
			iscale := 15 / maxScale
			for j := range sc {
				sc[j] = uint8(nearestInt(iscale * scales[j]))
			}
			putF16(b[80:82], maxScale/15)
		} else {
			*sc = [16]byte{}
			putF16(b[80:82], 0)
		}
		if maxMin > 0 {
			iscale := 15 / maxMin
			for j := range sc {
				sc[j] |= uint8(nearestInt(iscale*mins[j])) << 4
			}
			putF16(b[82:84], maxMin/15)
		} else {
			putF16(b[82:84], 0)
		}
		d, dmin := f16(b[80:82]), f16(b[82:84])
		for j := 0; j < 16; j++ {
			dj := d * float32(sc[j]&0xf)
			if dj == 0 {
				continue
			}
			dm := dmin * float32(sc[j]>>4)
			for ii := 0; ii < 16; ii++ {
				l := nearestInt((x[16*j+ii] + dm) / dj)
				L[16*j+ii] = uint8(max(0, min(3, l)))
			}
		}
		pack2Bit(&L, (*[64]byte)(b[16:80]))
	}
}

// encodeQ3_K: per 16-element group, a symmetric 3-bit fit (makeQ3Quants);
// the 16 group scales are quantized to 6 bits against d, the elements
// re-quantized to [-4, 3], and the third bits split off into hmask.
func encodeQ3_K(src []float32, dst []byte) {
	const bb, bs = 110, 256
	var Ls [256]int8
	var L [256]uint8
	var scales [16]float32
	for i := 0; i < len(src)/bs; i++ {
		x := (*[bs]float32)(src[i*bs:])
		b := (*[bb]byte)(dst[i*bb:])
		var maxScale, amax float32
		for j := 0; j < 16; j++ {
			scales[j] = makeQ3Quants(4, x[16*j:16*j+16], Ls[16*j:16*j+16])
			if a := absF32(scales[j]); a > amax {
				amax, maxScale = a, scales[j]
			}
		}
		sb := (*[12]byte)(b[96:108])
		*sb = [12]byte{}
		if maxScale != 0 {
			iscale := -32 / maxScale
			for j := 0; j < 16; j++ {
				l := int8(nearestInt(iscale * scales[j]))
				l = max(-32, min(31, l)) + 32
				if j < 8 {
					sb[j] = uint8(l) & 0xf
				} else {
					sb[j-8] |= (uint8(l) & 0xf) << 4
				}
				l >>= 4
				sb[8+j%4] |= uint8(l) << (2 * (j / 4))
			}
			putF16(b[108:110], 1/iscale)
		} else {
			putF16(b[108:110], 0)
		}
		d := f16(b[108:110])
		gs := q3kScales(sb)
		for j := 0; j < 16; j++ {
			dj := d * float32(gs[j])
			if dj == 0 {
				continue
			}
			for ii := 0; ii < 16; ii++ {
				l := nearestInt(x[16*j+ii] / dj)
				Ls[16*j+ii] = int8(max(-4, min(3, l)) + 4)
			}
		}
		hm := (*[32]byte)(b[0:32])
		*hm = [32]byte{}
		for j := range Ls {
			v := uint8(Ls[j])
			if v > 3 {
				hm[j%32] |= 1 << (j / 32)
				v -= 4
			}
			L[j] = v
		}
		pack2Bit(&L, (*[64]byte)(b[32:96]))
	}
}
