package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime/debug"
	"unsafe"

	"github.com/forge-llm/forge/dequant"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
)

// f32Weight returns the values of an F32 vector weight (norm weights,
// biases, rope frequencies) without copying when the bytes are aligned,
// which they are in a GGUF mapping (32-byte tensor alignment).
func f32Weight(what string, w *kernels.Weight) ([]float32, error) {
	if w == nil {
		return nil, fmt.Errorf("cpu: %s: nil weight", what)
	}
	if w.Type != gguf.TypeF32 {
		return nil, fmt.Errorf("cpu: %s: weight %q is %s, want F32", what, w.Name, w.Type)
	}
	n := w.Cols * max(w.Rows, 1)
	if len(w.Host) < 4*n {
		return nil, fmt.Errorf("cpu: %s: weight %q holds %d bytes, %d F32 values need %d", what, w.Name, len(w.Host), n, 4*n)
	}
	if n == 0 {
		return nil, nil
	}
	if uintptr(unsafe.Pointer(&w.Host[0]))%4 == 0 && littleEndian {
		return unsafe.Slice((*float32)(unsafe.Pointer(&w.Host[0])), n), nil
	}
	out := make([]float32, n) // unaligned copy: rare, never from a GGUF file
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(w.Host[4*i:]))
	}
	return out, nil
}

var littleEndian = func() bool { x := uint16(1); return *(*byte)(unsafe.Pointer(&x)) == 1 }()

// Embed copies rows ids of the table into dst, decoding them from the
// table's block type.
//
//	dst [len(ids)][table.Cols]
func (b *Backend) Embed(dst kernels.Tensor, table *kernels.Weight, ids []int32) (err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	defer recoverFault(&err, debug.SetPanicOnFault(true), "embed", table)
	if table == nil {
		return fmt.Errorf("cpu: embed: nil table")
	}
	cols := table.Cols
	if err := checkTensor("embed: dst", dst, len(ids)*cols); err != nil {
		return err
	}
	if !dequant.Supported(table.Type) {
		return fmt.Errorf("cpu: embed: table %q: type %s is not supported", table.Name, table.Type)
	}
	rb, err := rowBytes(table)
	if err != nil {
		return fmt.Errorf("cpu: embed: %w", err)
	}
	for i, id := range ids {
		if id < 0 || int(id) >= table.Rows {
			return fmt.Errorf("cpu: embed: table %q: token id %d at %d out of range [0,%d)", table.Name, id, i, table.Rows)
		}
		row := table.Host[int(id)*rb : (int(id)+1)*rb]
		if err := dequant.ToFloat32(table.Type, row, dst.Host[i*cols:(i+1)*cols]); err != nil {
			return fmt.Errorf("cpu: embed: table %q row %d: %w", table.Name, id, err)
		}
	}
	return nil
}

// rowBytes validates a weight's shape against its bytes and returns the
// bytes of one row.
func rowBytes(w *kernels.Weight) (int, error) {
	if !w.Type.Valid() {
		return 0, fmt.Errorf("weight %q: unknown type %d", w.Name, uint32(w.Type))
	}
	if w.Cols <= 0 || w.Rows <= 0 {
		return 0, fmt.Errorf("weight %q: bad shape %d×%d", w.Name, w.Rows, w.Cols)
	}
	bs := w.Type.BlockSize()
	if w.Cols%bs != 0 {
		return 0, fmt.Errorf("weight %q: %d columns is not a multiple of %s's block size %d", w.Name, w.Cols, w.Type, bs)
	}
	rb := w.Cols / bs * w.Type.BlockBytes()
	if len(w.Host) < rb*w.Rows {
		return 0, fmt.Errorf("weight %q: %d×%d %s needs %d bytes, have %d", w.Name, w.Rows, w.Cols, w.Type, rb*w.Rows, len(w.Host))
	}
	return rb, nil
}

// RMSNorm normalises n rows of w.Cols values and scales them by w:
// dst[i] = x[i] · 1/sqrt(mean(x[i]²) + eps) ⊙ w. As in ggml the sum of
// squares is accumulated in float64 and the two products are rounded
// separately.
//
//	x, dst [n][w.Cols]
func (b *Backend) RMSNorm(dst, x kernels.Tensor, w *kernels.Weight, n int, eps float32) (err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	defer recoverFault(&err, debug.SetPanicOnFault(true), "rmsnorm", w)
	wv, err := f32Weight("rmsnorm", w)
	if err != nil {
		return err
	}
	cols := w.Cols
	if err := checkTensor("rmsnorm: x", x, n*cols); err != nil {
		return err
	}
	if err := checkTensor("rmsnorm: dst", dst, n*cols); err != nil {
		return err
	}
	b.norm = normTask{dst: dst.Host, x: x.Host, w: wv[:cols], cols: cols, eps: eps}
	err = b.pool.parallel(&b.norm, n, max(1, 16384/max(cols, 1)))
	b.norm = normTask{}
	if err != nil {
		return opFault("rmsnorm", w, err)
	}
	return nil
}

type normTask struct {
	dst, x, w []float32
	cols      int
	eps       float32
}

func (t *normTask) run(_, lo, hi int) {
	for i := lo; i < hi; i++ {
		rmsNormRow(t.dst[i*t.cols:(i+1)*t.cols], t.x[i*t.cols:(i+1)*t.cols], t.w, t.eps)
	}
}

func rmsNormRow(dst, x, w []float32, eps float32) {
	var sum float64
	for _, v := range x {
		sum += float64(v * v)
	}
	mean := float32(sum / float64(len(x)))
	scale := 1 / float32(math.Sqrt(float64(mean+eps)))
	w = w[:len(x)]
	dst = dst[:len(x)]
	for i, v := range x {
		dst[i] = (v * scale) * w[i]
	}
}

// AddBias adds b (F32, bias.Cols values) to each of n rows of x in place.
//
//	x [n][bias.Cols]
func (b *Backend) AddBias(x kernels.Tensor, bias *kernels.Weight, n int) (err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	defer recoverFault(&err, debug.SetPanicOnFault(true), "add bias", bias)
	bv, err := f32Weight("add bias", bias)
	if err != nil {
		return err
	}
	cols := bias.Cols
	if err := checkTensor("add bias: x", x, n*cols); err != nil {
		return err
	}
	bv = bv[:cols]
	for i := range n {
		row := x.Host[i*cols : (i+1)*cols]
		for j, v := range bv {
			row[j] += v
		}
	}
	return nil
}

// RoPE rotates the first r.Dim values of every head of n tokens in place;
// token i is at position pos0+i. The angles are built as ggml builds its
// rope cache: θ_k = p·Scale·base^(-2k/Dim) / Freqs[k], the power taken by
// repeated float32 multiplication, so positions match llama.cpp's to the
// last bit of the angle.
//
//	x [n][heads][headDim]
func (b *Backend) RoPE(x kernels.Tensor, n, heads, headDim, pos0 int, r kernels.Rope) (err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	defer recoverFault(&err, debug.SetPanicOnFault(true), "rope: freqs", r.Freqs)
	if pos0 < 0 {
		return fmt.Errorf("cpu: rope: negative position %d", pos0)
	}
	freqs, scale, err := ropeArgs("rope", x, n, heads, headDim, r)
	if err != nil {
		return err
	}
	for i := range n {
		ropeRow(x.Host[i*heads*headDim:(i+1)*heads*headDim], heads, headDim, pos0+i, r, scale, freqs, b.ropeScratch(r.Dim))
	}
	return nil
}

// ropeArgs validates the arguments shared by RoPE and RoPEAt and returns
// the frequency divisors (nil for none) and the position scale.
func ropeArgs(op string, x kernels.Tensor, n, heads, headDim int, r kernels.Rope) ([]float32, float32, error) {
	if r.Dim <= 0 || r.Dim%2 != 0 || r.Dim > headDim {
		return nil, 0, fmt.Errorf("cpu: %s: rotated dims %d must be even and in (0, headDim=%d]", op, r.Dim, headDim)
	}
	if err := checkTensor("rope: x", x, n*heads*headDim); err != nil {
		return nil, 0, fmt.Errorf("%s: %w", op, err)
	}
	var freqs []float32
	if r.Freqs != nil {
		f, err := f32Weight("rope: freqs", r.Freqs)
		if err != nil {
			return nil, 0, err
		}
		if len(f) < r.Dim/2 {
			return nil, 0, fmt.Errorf("cpu: %s: freqs %q has %d values, need %d", op, r.Freqs.Name, len(f), r.Dim/2)
		}
		freqs = f
	}
	scale := r.Scale
	if scale == 0 {
		scale = 1
	}
	return freqs, scale, nil
}

// ropeScratch returns worker 0's buffer for one position's cos/sin pairs.
func (b *Backend) ropeScratch(dim int) []float32 {
	if cap(b.scratch[0].row) < dim {
		b.scratch[0].row = make([]float32, dim)
	}
	return b.scratch[0].row[:dim]
}

// ropeRow rotates the heads of one token at position pos in place. RoPE and
// RoPEAt both call it, so a token gets the same bits whichever op placed it.
func ropeRow(x []float32, heads, headDim, pos int, r kernels.Rope, scale float32, freqs, cs []float32) {
	half := r.Dim / 2
	thetaScale := float32(math.Pow(float64(r.Base), -2/float64(r.Dim)))
	theta := float32(pos)
	for k := range half {
		t := theta
		if freqs != nil {
			t /= freqs[k]
		}
		t *= scale
		cs[2*k] = float32(math.Cos(float64(t)))
		cs[2*k+1] = float32(math.Sin(float64(t)))
		theta *= thetaScale
	}
	for h := range heads {
		v := x[h*headDim : (h+1)*headDim]
		if r.NeoX {
			for k := range half {
				c, s := cs[2*k], cs[2*k+1]
				x0, x1 := v[k], v[k+half]
				v[k] = x0*c - x1*s
				v[k+half] = x0*s + x1*c
			}
		} else {
			for k := range half {
				c, s := cs[2*k], cs[2*k+1]
				x0, x1 := v[2*k], v[2*k+1]
				v[2*k] = x0*c - x1*s
				v[2*k+1] = x0*s + x1*c
			}
		}
	}
}

// SiLUMul computes dst = silu(gate) ⊙ up over n values, silu(x) = x/(1+e^-x).
func (b *Backend) SiLUMul(dst, gate, up kernels.Tensor, n int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := checkTensor("silu mul: dst", dst, n); err != nil {
		return err
	}
	if err := checkTensor("silu mul: gate", gate, n); err != nil {
		return err
	}
	if err := checkTensor("silu mul: up", up, n); err != nil {
		return err
	}
	b.silu = siluTask{d: dst.Host[:n], g: gate.Host[:n], u: up.Host[:n]}
	err := b.pool.parallel(&b.silu, n, 4096) // exp is the costly part: split big prompts
	b.silu = siluTask{}
	if err != nil {
		return opFault("silu mul", nil, err)
	}
	return nil
}

// siluTask computes silu(g)·u over a range of elements.
type siluTask struct{ d, g, u []float32 }

func (t *siluTask) run(_, lo, hi int) {
	siluMul(t.d[lo:hi], t.g[lo:hi], t.u[lo:hi])
}

// Add computes dst = a + b over n values.
func (b *Backend) Add(dst, a, c kernels.Tensor, n int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := checkTensor("add: dst", dst, n); err != nil {
		return err
	}
	if err := checkTensor("add: a", a, n); err != nil {
		return err
	}
	if err := checkTensor("add: b", c, n); err != nil {
		return err
	}
	d, x, y := dst.Host[:n], a.Host[:n], c.Host[:n]
	for i := range d {
		d[i] = x[i] + y[i]
	}
	return nil
}
