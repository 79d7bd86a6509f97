package gpu

import (
	"fmt"
	"math"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/rocm"
)

// mvMaxN is how many activation rows one matvec launch multiplies (the
// kernels' MV_MAXNX). More rows than kernels.MaxBatchRows go through
// dequantize-to-f16 + GEMM (F32 weights excepted); 2 to MaxBatchRows rows
// through the multi-row matvec kernels (matvecRows).
//
// vendorMinN is the smallest n whose GEMM goes to cuBLAS (where found):
// the first row count past the mmq kernels' range (kernels.MaxBatchRows).
// Smaller ones (the weights without mmq kernels) run gemm.cu; at tens of
// rows the dequantization to f16 dominates either way, and a short first
// prompt then never waits for cuBLAS, which opens in the background
// (openVendor). From 65 rows on gemm.cu fell behind: 4 × 120-row pieces
// of the 8B shape spent 143 µs a product in gemm_f16 against ~30 µs in
// cuBLAS at 150 rows on the H200 (bench/results/2026-11-26-pieces-h100.md;
// it was 128). The choice depends on n alone, so a prompt gives the same
// logits however fast cuBLAS came.
const (
	mvMaxN     = 8
	vendorMinN = kernels.MaxBatchRows + 1
)

func dptr(t kernels.Tensor) rocm.DevPtr { return rocm.DevPtr(t.Dev) }

func off(t kernels.Tensor, n int) rocm.DevPtr { return rocm.DevPtr(t.Dev + uintptr(n)*4) }

// Embed copies rows ids of table into dst, decoding the blocks on the device.
//
//	dst [len(ids)][table.Cols]
func (b *Backend) Embed(dst kernels.Tensor, table *kernels.Weight, ids []int32) error {
	kt, ok := kernelType(table.Type)
	if !ok {
		return fmt.Errorf("gpu: embed %q: type %s is not supported on the GPU", table.Name, table.Type)
	}
	if len(ids) == 0 {
		return nil
	}
	if err := checkTensor("embed: dst", dst, len(ids)*table.Cols); err != nil {
		return err
	}
	for i, id := range ids {
		if id < 0 || int(id) >= table.Rows {
			return fmt.Errorf("gpu: embed %q: id %d (position %d) outside [0,%d)", table.Name, id, i, table.Rows)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	wp, err := b.weightPtr(table)
	if err != nil {
		return err
	}
	return b.do(func(c *rocm.Ctx) error {
		var idp rocm.DevPtr
		if b.step.batch { // a recorded batched step: the layout's ids
			if !b.lay.ids || len(ids) != len(b.lay.pos) {
				return fmt.Errorf("gpu: embed of %d ids in a batched step whose layout has no ids for them", len(ids))
			}
			idp = b.lay.idsPtr()
		} else if len(ids) == 1 && b.step.on {
			idp = b.step.slots // the token of the replayed step
		}
		if len(ids) > 1 && !b.step.batch {
			p, err := b.scratchBuf(c, "ids", int64(4*len(ids)))
			if err != nil {
				return err
			}
			if b.step.capturing {
				return fmt.Errorf("gpu: embed of %d ids while capturing a decode step", len(ids))
			}
			raw := make([]byte, 4*len(ids))
			for i, id := range ids {
				raw[4*i], raw[4*i+1], raw[4*i+2], raw[4*i+3] = byte(id), byte(id>>8), byte(id>>16), byte(id>>24)
			}
			// In the stream's order: after the queued ops (one may still
			// read the buffer), before the embedding.
			if err := c.CopyHtoDStream(p, raw, b.stream); err != nil {
				return err
			}
			idp = p
		}
		var a rocm.Args
		a.Ptr(wp).Ptr(idp).I32(ids[0]).Ptr(dptr(dst)).I32(int32(table.Cols))
		return b.launch(c, "embed_"+kt, rocm.D1(len(ids)), rocm.D1(128), &a)
	})
}

// MatMul multiplies n activation rows by a weight in block form.
//
//	x [n][w.Cols], dst [n][w.Rows]
//
// n = 1: the decode matrix–vector kernels. 2 ≤ n ≤ kernels.MaxBatchRows:
// the multi-row matvec kernels, 8 or 16 rows per launch reading the blocks
// once per launch, each row bit for bit what n = 1 gives it (batch
// invariance, kernels.Batcher; see rowKernel): 8-bit-activation kernels
// for Q4_K, Q6_K (16-byte aligned) and Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (where
// b32Fits), the generic float kernel for every other type. F32 weights
// stay on the float kernels at any n (exact to float32). Otherwise the
// weight is dequantized to f16 on the device and multiplied by the
// f16-rounded activations in a tensor-core GEMM (for the types whose
// prompt products are chosen 8-bit, Q4_0 by default: the f16 of x's 8-bit
// form, or the mmq32 kernels, mmq32.go): rows of a prompt chunk longer
// than MaxBatchRows are not row-invariant.
func (b *Backend) MatMul(dst kernels.Tensor, w *kernels.Weight, x kernels.Tensor, n int) error {
	return b.matMul(dst, w, x, kernels.Q8{}, n, false)
}

// promptGEMMMinN is the shortest prompt piece MatMulPrompt multiplies
// through the dequantize + GEMM path: from about 16 rows on it is faster
// than the multi-row matrix–vector kernels (up to 3× at 64 rows on the
// H100, bench/results/2026-11-25-batch-matmul-h100.md).
const promptGEMMMinN = 16

// MatMulPrompt implements kernels.PromptMatMuler: pieces of promptGEMMMinN
// rows or more go through the GEMM path (gemm.cu, cuBLAS from vendorMinN
// rows), shorter ones through MatMul's kernels. The choice depends on n
// alone (and the weight): where the mmq kernels fit (mmq.go), pieces of up
// to kernels.MaxBatchRows rows take them instead of the GEMM: on the H100 up
// to 8× faster at 16 rows, level at 64 rows of the widest Q4_K weight
// (bench/results/2026-11-25-mmq-h100.md).
func (b *Backend) MatMulPrompt(dst kernels.Tensor, w *kernels.Weight, x kernels.Tensor, n int) error {
	return b.matMul(dst, w, x, kernels.Q8{}, n, n >= promptGEMMMinN)
}

// MatMulQ8 implements kernels.Q8Ops: MatMul, on xq where it is given.
func (b *Backend) MatMulQ8(dst kernels.Tensor, w *kernels.Weight, x kernels.Tensor, xq kernels.Q8, n int) error {
	return b.matMul(dst, w, x, xq, n, false)
}

func (b *Backend) matMul(dst kernels.Tensor, w *kernels.Weight, x kernels.Tensor, xq kernels.Q8, n int, gemm bool) error {
	kt, err := b.checkProduct("matmul", dst, w, x, n)
	if err != nil || n <= 0 {
		return err
	}
	q, err := devQ8("matmul", xq, n, w.Cols)
	if err != nil {
		return err
	}
	if n >= vendorMinN {
		b.waitVendor()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	wp, err := b.weightPtr(w)
	if err != nil {
		return err
	}
	return b.do(func(c *rocm.Ctx) error {
		return b.product(c, kt, w, wp, dst, x, n, gemm, &q)
	})
}

// checkProduct checks one product's shapes and returns the weight's kernel
// type.
func (b *Backend) checkProduct(op string, dst kernels.Tensor, w *kernels.Weight, x kernels.Tensor, n int) (string, error) {
	kt, ok := kernelType(w.Type)
	if !ok {
		return "", fmt.Errorf("gpu: %s %q: type %s is not supported on the GPU", op, w.Name, w.Type)
	}
	if n <= 0 {
		return kt, nil
	}
	if err := checkTensor(op+": x", x, n*w.Cols); err != nil {
		return "", err
	}
	if err := checkTensor(op+": dst", dst, n*w.Rows); err != nil {
		return "", err
	}
	return kt, nil
}

// product queues dst [n][w.Rows] = x [n][w.Cols] · wᵀ with the kernels
// MatMul (gemm unset) or MatMulPrompt (gemm set) choose. A path that reads
// 8-bit x takes q's copy, quantizing x into it first if q is empty (a
// product sharing its input with others passes the same q to each: x is
// quantized once, by the first that needs it). Call with b.mu held, on the
// worker.
func (b *Backend) product(c *rocm.Ctx, kt string, w *kernels.Weight, wp rocm.DevPtr, dst, x kernels.Tensor, n int, gemm bool, q *q8x) error {
	if gemm && n <= b.batchRows() && !b.mmqNoPrompt && b.mmqUse(w, wp, n) {
		gemm = false // a prompt piece of few rows: the mmq kernels beat dequantizing the weight
	}
	if (gemm || n > b.batchRows()) && w.Type != gguf.TypeF32 {
		if n <= mmq32MaxRows && b.mmq32Fits(w, wp) {
			return b.mmq32(c, kt, w, wp, dst, x, n, q) // 8-bit x as on the CPU (mmq32.go)
		}
		return b.gemm(c, kt, w, wp, dst, x, n)
	}
	if n > 1 && n <= b.batchRows() {
		return b.matvecRows(c, kt, w, wp, dst, x, n, q)
	}
	if n == 1 {
		return b.matvec(c, kt, w, wp, dptr(dst), dptr(x), 1, q)
	}
	// F32 weights, more rows than a batch: the generic float kernel, every
	// chunk of mvMaxN rows in one launch.
	return b.mvGeneric(c, "mv_"+kt, w, wp, dptr(dst), dptr(x), n)
}

// mvGeneric queues y [n][rows] = x [n][cols] · wᵀ with the generic float
// kernel (mvArgsGeneric) in one launch: grid.y takes the chunks of mvMaxN
// rows of x (matvec.cu, MV_CHUNK), each row's sum the same as in a launch
// of its own.
func (b *Backend) mvGeneric(c *rocm.Ctx, kernel string, w *kernels.Weight, wp, y, x rocm.DevPtr, n int) error {
	chunks := ceilDiv(n, mvMaxN)
	if chunks > 65535 {
		return fmt.Errorf("gpu: matvec %q: %d rows of x are more than one launch takes", w.Name, n)
	}
	var a rocm.Args
	a.Ptr(wp).Ptr(x).Ptr(y).I32(int32(w.Rows)).I32(int32(w.Cols)).I32(int32(n))
	grid := rocm.Dim3{X: uint32(ceilDiv(w.Rows, mvBlock/b.warp)), Y: uint32(chunks), Z: 1}
	return b.launch(c, kernel, grid, rocm.D1(mvBlock), &a)
}

// launchDevice is what launch choice (launch.go) knows of this device.
func (b *Backend) launchDevice() LaunchDevice {
	return LaunchDevice{Warp: b.warp, SMs: b.w.Device.SMs}
}

// matvec queues y [nx][rows] = x [nx][cols] · wᵀ with the kernel
// planMatvec chooses; one on 8-bit x (one row) reads q's copy (q8For).
func (b *Backend) matvec(c *rocm.Ctx, kt string, w *kernels.Weight, wp, y, x rocm.DevPtr, nx int, q *q8x) error {
	o := mvOverrides{Variant: b.mvVariant, BlocksPerSM: b.mvBlocksPerSM}
	if o == (mvOverrides{}) {
		o.BlocksPerSM = b.tune.perSM(w.Type, w.Rows)
	}
	p, err := planMatvec(b.launchDevice(), w.Type, w.Rows, w.Cols, nx, uintptr(wp)%16 == 0, uintptr(x)%16 == 0, o)
	if err != nil {
		return err
	}
	var a rocm.Args
	switch p.Args {
	case mvArgsQ8:
		xq, err := b.q8For(c, x, w.Cols, q)
		if err != nil {
			return err
		}
		a.Ptr(wp).Ptr(xq.codes).Ptr(xq.scales).Ptr(y).I32(int32(w.Rows)).I32(int32(w.Cols))
	case mvArgsFloat:
		a.Ptr(wp).Ptr(x).Ptr(y).I32(int32(w.Rows)).I32(int32(w.Cols))
	default:
		a.Ptr(wp).Ptr(x).Ptr(y).I32(int32(w.Rows)).I32(int32(w.Cols)).I32(int32(nx))
	}
	return b.launch(c, p.Kernel, rocm.D1(p.Grid), rocm.D1(mvBlock), &a)
}

// quantizeX queues x [cols] f32 -> int8 blocks of 32 with f32 scales, into
// the "xq" scratch; it returns the codes and the scales. Every call
// quantizes: a copy to be shared is the caller's to keep (q8For).
func (b *Backend) quantizeX(c *rocm.Ctx, x rocm.DevPtr, cols int) (xq, xd rocm.DevPtr, err error) {
	p, d, err := b.q8Buf(c, cols)
	if err != nil {
		return 0, 0, err
	}
	var a rocm.Args
	a.Ptr(x).Ptr(p).Ptr(d).I32(int32(cols))
	if err := b.launch(c, "quantize_q8", rocm.D1(ceilDiv(cols, 256)), rocm.D1(256), &a); err != nil {
		return 0, 0, err
	}
	return p, d, nil
}

// mvQ8 queues the Q4_K/Q6_K kernel variant v on 8-bit activations
// (planQ8; benchmarks call it directly).
func (b *Backend) mvQ8(c *rocm.Ctx, kt, v string, w *kernels.Weight, wp, y, xq, xd rocm.DevPtr) error {
	p := planQ8(b.launchDevice(), kt, v, w.Rows, w.Cols, b.mvBlocksPerSM)
	var a rocm.Args
	a.Ptr(wp).Ptr(xq).Ptr(xd).Ptr(y).I32(int32(w.Rows)).I32(int32(w.Cols))
	return b.launch(c, p.Kernel, rocm.D1(p.Grid), rocm.D1(mvBlock), &a)
}

// gemm queues the prompt path: w to f16 [rows][kpad], x to f16 [n][kpad],
// then dst [n][rows] = x·wᵀ on the matrix units.
func (b *Backend) gemm(c *rocm.Ctx, kt string, w *kernels.Weight, wp rocm.DevPtr, dst, x kernels.Tensor, n int) error {
	kpad := (w.Cols + 31) &^ 31
	wh, err := b.scratchBuf(c, "gemm-w", int64(w.Rows)*int64(kpad)*2)
	if err != nil {
		return err
	}
	xh, err := b.scratchBuf(c, "gemm-x", int64(n)*int64(kpad)*2)
	if err != nil {
		return err
	}
	if err := b.dequantF16(c, kt, w, wp, wh, kpad); err != nil {
		return err
	}
	var a rocm.Args
	if b.q8GEMM(w) { // x in the 8-bit form the CPU multiplies (mmq32.go); kpad = w.Cols
		a.Ptr(dptr(x)).Ptr(xh).I32(int32(n * w.Cols))
		if err := b.launch(c, "q8_to_f16", rocm.D1(ceilDiv(n*w.Cols, 256)), rocm.D1(256), &a); err != nil {
			return err
		}
	} else {
		a.Ptr(dptr(x)).Ptr(xh).I32(int32(n)).I32(int32(w.Cols)).I32(int32(kpad))
		if err := b.launch(c, "f32_to_f16", grid1(n*kpad), rocm.D1(256), &a); err != nil {
			return err
		}
	}
	return b.gemmF16(c, wh, xh, dptr(dst), w.Rows, n, kpad)
}

// gemmF16 queues C [n][m] = X [n][k] · W [m][k]ᵀ on f16 operands: through
// cuBLAS when it was found (three times gemm_f16's speed on an H100), else
// gemm.cu.
func (b *Backend) gemmF16(c *rocm.Ctx, wh, xh, dst rocm.DevPtr, m, n, k int) error {
	var a rocm.Args
	a.Ptr(wh).Ptr(xh).Ptr(dst).I32(int32(m)).I32(int32(n)).I32(int32(k))
	if b.vendor != nil && b.gemmKernel == "" && n >= vendorMinN {
		if b.prof != nil && !b.step.capturing {
			return b.prof.timed(c, "cublas_gemm", b.stream, func() error { return b.vendor.gemm(dst, wh, xh, m, n, k) })
		}
		return b.vendor.gemm(dst, wh, xh, m, n, k)
	}
	name := "gemm_f16"
	if b.gemmKernel != "" {
		name = b.gemmKernel
	}
	l := planGEMM(name, m, n)
	return b.launch(c, l.Kernel, l.Grid, l.Block, &a)
}

func (b *Backend) dequantF16(c *rocm.Ctx, kt string, w *kernels.Weight, wp, out rocm.DevPtr, kpad int) error {
	items, _ := dequantItems(w.Type, w.Rows, w.Cols, kpad)
	var a rocm.Args
	a.Ptr(wp).Ptr(out).I32(int32(w.Rows)).I32(int32(w.Cols)).I32(int32(kpad))
	return b.launch(c, "deq16_"+kt, grid1(items), rocm.D1(256), &a)
}

// Dequantize decodes a whole weight on the device: dst [w.Rows][w.Cols] f32.
// For types without a kernel of their own elsewhere, and for checks.
func (b *Backend) Dequantize(dst kernels.Tensor, w *kernels.Weight) error {
	kt, ok := kernelType(w.Type)
	if !ok {
		return fmt.Errorf("gpu: dequantize %q: type %s is not supported on the GPU", w.Name, w.Type)
	}
	if err := checkTensor("dequantize: dst", dst, w.Rows*w.Cols); err != nil {
		return err
	}
	if dst.Dev%16 != 0 {
		return fmt.Errorf("gpu: dequantize %q: dst must be 16-byte aligned (the kernel stores float4)", w.Name)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	wp, err := b.weightPtr(w)
	if err != nil {
		return err
	}
	_, items := dequantItems(w.Type, w.Rows, w.Cols, w.Cols)
	return b.do(func(c *rocm.Ctx) error {
		var a rocm.Args
		a.Ptr(wp).Ptr(dptr(dst)).I32(int32(w.Rows)).I32(int32(w.Cols))
		return b.launch(c, "deq32_"+kt, grid1(items), rocm.D1(256), &a)
	})
}

// DequantizeF16 decodes w into f16 rows of kpad values (kpad ≥ w.Cols, a
// multiple of 32; the tail is zero) at out, the operand layout of GEMMF16.
func (b *Backend) DequantizeF16(out rocm.DevPtr, w *kernels.Weight, kpad int) error {
	kt, ok := kernelType(w.Type)
	if !ok {
		return fmt.Errorf("gpu: dequantize %q: type %s is not supported on the GPU", w.Name, w.Type)
	}
	if kpad < w.Cols || kpad%32 != 0 || (w.Type.BlockSize() > 1 && kpad != w.Cols) {
		return fmt.Errorf("gpu: dequantize %q: row stride %d for %d columns of %s", w.Name, kpad, w.Cols, w.Type)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	wp, err := b.weightPtr(w)
	if err != nil {
		return err
	}
	return b.do(func(c *rocm.Ctx) error {
		return b.dequantF16(c, kt, w, wp, out, kpad)
	})
}

// GEMMF16 queues C [n][m] f32 = X [n][k] · W [m][k]ᵀ for f16 operands in
// device memory (k a multiple of 32, rows 16-byte aligned).
func (b *Backend) GEMMF16(cOut, w, x rocm.DevPtr, m, n, k int) error {
	if k%32 != 0 || m <= 0 || n <= 0 {
		return fmt.Errorf("gpu: gemm %d×%d×%d: k must be a positive multiple of 32", m, n, k)
	}
	if n >= vendorMinN {
		b.waitVendor()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.do(func(c *rocm.Ctx) error {
		return b.gemmF16(c, w, x, cOut, m, n, k)
	})
}

func (b *Backend) normWeight(op string, w *kernels.Weight, cols int) (rocm.DevPtr, error) {
	if w == nil || w.Type != gguf.TypeF32 {
		return 0, fmt.Errorf("gpu: %s: weight must be F32", op)
	}
	if w.Cols < cols {
		return 0, fmt.Errorf("gpu: %s: weight %q has %d values, need %d", op, w.Name, w.Cols, cols)
	}
	return b.weightPtr(w)
}

// RMSNorm normalises n rows of w.Cols values and scales them by w.
func (b *Backend) RMSNorm(dst, x kernels.Tensor, w *kernels.Weight, n int, eps float32) error {
	_, err := b.rmsNorm("rmsnorm", dst, x, kernels.Tensor{}, w, n, eps, kernels.Q8{})
	return err
}

// RMSNormQ8 implements kernels.Q8Ops: RMSNorm, one row (the decode shape)
// also quantized into q by rmsnorm_row itself.
func (b *Backend) RMSNormQ8(dst, x kernels.Tensor, w *kernels.Weight, n int, eps float32, q kernels.Q8) (kernels.Q8, error) {
	return b.rmsNorm("rmsnorm", dst, x, kernels.Tensor{}, w, n, eps, q)
}

// AddRMSNorm adds the residual r to x in place, then normalises it:
// x += r; dst = x / sqrt(mean(x²) + eps) ⊙ w, over n rows of w.Cols values
// (kernels.ResidualNormer). One kernel instead of two.
func (b *Backend) AddRMSNorm(dst, x, r kernels.Tensor, w *kernels.Weight, n int, eps float32) error {
	if w != nil {
		if err := checkTensor("add·rmsnorm: r", r, n*w.Cols); err != nil {
			return err
		}
	}
	_, err := b.rmsNorm("add·rmsnorm", dst, x, r, w, n, eps, kernels.Q8{})
	return err
}

// AddRMSNormQ8 implements kernels.Q8Ops: AddRMSNorm, one row also
// quantized into q by rmsnorm_row itself.
func (b *Backend) AddRMSNormQ8(dst, x, r kernels.Tensor, w *kernels.Weight, n int, eps float32, q kernels.Q8) (kernels.Q8, error) {
	if w != nil {
		if err := checkTensor("add·rmsnorm: r", r, n*w.Cols); err != nil {
			return kernels.Q8{}, err
		}
	}
	return b.rmsNorm("add·rmsnorm", dst, x, r, w, n, eps, q)
}

var _ kernels.ResidualNormer = (*Backend)(nil)

// rmsNorm queues RMSNorm (r.Dev == 0) or AddRMSNorm. One row, the decode
// shape, goes to rmsnorm_row, which also quantizes the row to 8 bits into
// q for the products that follow (where q is given, unless noFuse: then
// it returns q); 2 to kernels.MaxBatchRows rows (a batched step) to one
// block of rmsnorm_row each, so that every row gets the bits it gets alone
// (batch invariance, kernels.Batcher); more rows to one 256-thread block
// each.
func (b *Backend) rmsNorm(op string, dst, x, r kernels.Tensor, w *kernels.Weight, n int, eps float32, q kernels.Q8) (kernels.Q8, error) {
	if w == nil {
		return kernels.Q8{}, fmt.Errorf("gpu: %s: nil weight", op)
	}
	cols := w.Cols
	if err := checkTensor(op+": x", x, n*cols); err != nil {
		return kernels.Q8{}, err
	}
	if err := checkTensor(op+": dst", dst, n*cols); err != nil {
		return kernels.Q8{}, err
	}
	if n <= 0 {
		return kernels.Q8{}, nil
	}
	dq, err := devQ8(op, q, n, cols)
	if err != nil {
		return kernels.Q8{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	wp, err := b.normWeight(op, w, cols)
	if err != nil {
		return kernels.Q8{}, err
	}
	l, fuse := planNorm(n, cols, r.Dev != 0, !b.noFuse)
	if !fuse {
		dq, q = q8x{}, kernels.Q8{}
	}
	err = b.do(func(c *rocm.Ctx) error {
		var a rocm.Args
		if l.Kernel == "rmsnorm_row" {
			a.Ptr(dptr(dst)).Ptr(dptr(x)).Ptr(dptr(r)).Ptr(wp).I32(int32(cols)).F32(eps).Ptr(dq.codes).Ptr(dq.scales)
			return b.launch(c, l.Kernel, l.Grid, l.Block, &a)
		}
		if r.Dev != 0 {
			a.Ptr(dptr(dst)).Ptr(dptr(x)).Ptr(dptr(r)).Ptr(wp).I32(int32(cols)).F32(eps)
		} else {
			a.Ptr(dptr(dst)).Ptr(dptr(x)).Ptr(wp).I32(int32(cols)).F32(eps)
		}
		return b.launch(c, l.Kernel, l.Grid, l.Block, &a)
	})
	if err != nil {
		return kernels.Q8{}, err
	}
	return q, nil
}

var _ kernels.NormPairer = (*Backend)(nil)

// RMSNormPair implements kernels.NormPairer: where both sets take
// rmsnorm_row (at most kernels.MaxBatchRows rows each: a decode step's
// query and key heads), one launch of rmsnorm_row2 over both, each row
// rmsnorm_row's arithmetic; otherwise the two RMSNorms.
func (b *Backend) RMSNormPair(dstA, xA kernels.Tensor, wA *kernels.Weight, nA int, dstB, xB kernels.Tensor, wB *kernels.Weight, nB int, eps float32) error {
	if wA == nil || wB == nil || wA.Cols != wB.Cols || nA <= 0 || nB <= 0 || nA > kernels.MaxBatchRows || nB > kernels.MaxBatchRows {
		if err := b.RMSNorm(dstA, xA, wA, nA, eps); err != nil {
			return err
		}
		return b.RMSNorm(dstB, xB, wB, nB, eps)
	}
	const op = "rmsnorm pair"
	cols := wA.Cols
	for _, c := range []struct {
		what string
		t    kernels.Tensor
		n    int
	}{{"x a", xA, nA}, {"dst a", dstA, nA}, {"x b", xB, nB}, {"dst b", dstB, nB}} {
		if err := checkTensor(op+": "+c.what, c.t, c.n*cols); err != nil {
			return err
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	wa, err := b.normWeight(op, wA, cols)
	if err != nil {
		return err
	}
	wb, err := b.normWeight(op, wB, cols)
	if err != nil {
		return err
	}
	l, _ := planNorm(nA, cols, false, false) // rmsnorm_row's block: the same bits
	return b.do(func(c *rocm.Ctx) error {
		var a rocm.Args
		a.Ptr(dptr(dstA)).Ptr(dptr(xA)).Ptr(wa).I32(int32(nA)).Ptr(dptr(dstB)).Ptr(dptr(xB)).Ptr(wb).I32(int32(cols)).F32(eps)
		return b.launch(c, "rmsnorm_row2", rocm.D1(nA+nB), l.Block, &a)
	})
}

// AddBias adds the F32 vector bias to each of n rows of x in place.
func (b *Backend) AddBias(x kernels.Tensor, bias *kernels.Weight, n int) error {
	if bias == nil {
		return fmt.Errorf("gpu: add bias: nil weight")
	}
	if err := checkTensor("add bias: x", x, n*bias.Cols); err != nil {
		return err
	}
	if n <= 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	bp, err := b.normWeight("add bias", bias, bias.Cols)
	if err != nil {
		return err
	}
	return b.do(func(c *rocm.Ctx) error {
		var a rocm.Args
		a.Ptr(dptr(x)).Ptr(bp).I32(int32(n)).I32(int32(bias.Cols))
		return b.launch(c, "add_bias", grid1(n*bias.Cols), rocm.D1(256), &a)
	})
}

// RoPE rotates n tokens of heads×headDim values in place (token i at
// position pos0+i).
func (b *Backend) RoPE(x kernels.Tensor, n, heads, headDim, pos0 int, r kernels.Rope) error {
	if heads <= 0 || pos0 < 0 {
		return fmt.Errorf("gpu: rope: %d heads at position %d", heads, pos0)
	}
	dim, scale, neox, err := ropeArgs("rope", "rope: x", x, n, heads, headDim, r)
	if err != nil || n <= 0 {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	fp, err := b.ropeFreqs(r, dim)
	if err != nil {
		return err
	}
	return b.do(func(c *rocm.Ctx) error {
		var a rocm.Args
		a.Ptr(dptr(x)).I32(int32(n)).I32(int32(heads)).I32(int32(headDim)).I32(int32(pos0)).I32(int32(dim)).
			F32(r.Base).F32(scale).Ptr(fp).I32(neox).Ptr(b.stepPos())
		return b.launch(c, "rope", grid1(n*heads*dim/2), rocm.D1(256), &a)
	})
}

// ropeArgs checks what RoPE and RoPEAt share (xName names x in an error) and returns the rotated
// dimensions, the position scale and the NeoX flag as the kernels take
// them.
func ropeArgs(op, xName string, x kernels.Tensor, n, heads, headDim int, r kernels.Rope) (dim int, scale float32, neox int32, err error) {
	dim = r.Dim
	if dim == 0 {
		dim = headDim
	}
	if dim <= 0 || dim%2 != 0 || dim > headDim {
		return 0, 0, 0, fmt.Errorf("gpu: %s: rotated dimension %d must be even and within the head dimension %d", op, dim, headDim)
	}
	if err := checkTensor(xName, x, n*heads*headDim); err != nil {
		return 0, 0, 0, err
	}
	scale = r.Scale
	if scale == 0 {
		scale = 1
	}
	if r.NeoX {
		neox = 1
	}
	return dim, scale, neox, nil
}

// ropeFreqs is the device address of r's frequency divisors (dim/2 F32
// values), 0 for none. Call with b.mu held.
func (b *Backend) ropeFreqs(r kernels.Rope, dim int) (rocm.DevPtr, error) {
	if r.Freqs == nil {
		return 0, nil
	}
	return b.normWeight("rope freqs", r.Freqs, dim/2)
}

// checkAttn checks what Attention and PagedAttention share: the heads
// (even head sizes up to 256, which the kernels are built for) against the
// store's row width and layers.
func checkAttn(op, store string, at kernels.Attn, kvDim, layers, layer int) error {
	if at.Heads <= 0 || at.KVHeads <= 0 || at.HeadDim <= 0 || at.Heads%at.KVHeads != 0 {
		return fmt.Errorf("gpu: %s: bad heads=%d kvHeads=%d headDim=%d", op, at.Heads, at.KVHeads, at.HeadDim)
	}
	if store == "pool" && at.Softcap > 0 {
		return fmt.Errorf("gpu: %s: a score soft-cap is not supported on the paged pool (continuous batching) yet", op)
	}
	if at.HeadDim > 256 || at.HeadDim%2 != 0 {
		return fmt.Errorf("gpu: %s: head dimension %d: only even sizes up to 256 are supported", op, at.HeadDim)
	}
	if d := at.KVHeads * at.HeadDim; d != kvDim {
		return fmt.Errorf("gpu: %s: kvHeads·headDim = %d but the %s holds rows of %d", op, d, store, kvDim)
	}
	if layer < 0 || layer >= layers {
		return fmt.Errorf("gpu: %s: layer %d out of range [0,%d)", op, layer, layers)
	}
	return nil
}

// Attention stores the n new keys and values of one layer in the cache and
// computes causal grouped-query attention for the n queries. One or two
// tokens take the decode kernel (a block per head and token); more take the
// prompt kernel (a block per head and 8 tokens, keys and values staged in
// shared memory once for all 8).
func (b *Backend) Attention(out, q, k, v kernels.Tensor, kc *kernels.KVCache, layer, pos0, n int, at kernels.Attn) error {
	_, err := b.attention(out, q, k, v, kc, layer, pos0, n, at, kernels.Q8{})
	return err
}

var _ kernels.QKVPreparer = (*Backend)(nil)

// PrepareQKV implements kernels.QKVPreparer: one qkv_prep launch, a block
// per query head and per key (and value) head, with rmsnorm_row's block so
// that the norms keep their bits.
func (b *Backend) PrepareQKV(q, k, v kernels.Tensor, qw, kw *kernels.Weight, eps float32, kc *kernels.KVCache, layer, pos int, r kernels.Rope, at kernels.Attn) error {
	const op = "prepare qkv"
	pa, err := b.checkPrep(op, q, k, v, kc, layer, pos, r, at)
	if err != nil {
		return err
	}
	kp, vp, dim, scale, neox, sfx := pa.kp, pa.vp, pa.dim, pa.scale, pa.neox, pa.sfx
	for _, w := range []*kernels.Weight{qw, kw} {
		if w != nil && w.Cols != at.HeadDim {
			return fmt.Errorf("gpu: %s: norm %s of %d values for heads of %d", op, w.Name, w.Cols, at.HeadDim)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var wq, wk rocm.DevPtr
	if qw != nil {
		if wq, err = b.normWeight(op, qw, at.HeadDim); err != nil {
			return err
		}
	}
	if kw != nil {
		if wk, err = b.normWeight(op, kw, at.HeadDim); err != nil {
			return err
		}
	}
	fp, err := b.ropeFreqs(r, dim)
	if err != nil {
		return err
	}
	l, _ := planNorm(1, at.HeadDim, false, false) // rmsnorm_row's block: the norms' bits
	return b.do(func(c *rocm.Ctx) error {
		var a rocm.Args
		a.Ptr(dptr(q)).Ptr(dptr(k)).Ptr(dptr(v)).Ptr(wq).Ptr(wk).I32(int32(at.Heads)).I32(int32(at.KVHeads)).
			I32(int32(at.HeadDim)).F32(eps).Ptr(kp).Ptr(vp).I32(int32(pos)).Ptr(b.stepPos()).
			I32(int32(dim)).F32(r.Base).F32(scale).Ptr(fp).I32(neox)
		return b.launch(c, "qkv_prep_"+sfx, rocm.D1(at.Heads+at.KVHeads), l.Block, &a)
	})
}

// prepArgs is what PrepareQKV and AttendQKVQ8 both check and derive: the
// layer's keys and values in the cache, RoPE's arguments (ropeArgs), the
// cache's kernel suffix.
type prepArgs struct {
	kp, vp rocm.DevPtr
	dim    int
	scale  float32
	neox   int32
	sfx    string
}

// checkPrep checks one token's q, k and v against at, and its position
// against kc's context.
func (b *Backend) checkPrep(op string, q, k, v kernels.Tensor, kc *kernels.KVCache, layer, pos int, r kernels.Rope, at kernels.Attn) (prepArgs, error) {
	var pa prepArgs
	kp, vp, esize, err := b.cacheLayer(op, kc, layer, at)
	if err != nil {
		return pa, err
	}
	if pos < 0 || pos >= kc.Ctx {
		return pa, fmt.Errorf("gpu: %s: position %d outside the context of %d", op, pos, kc.Ctx)
	}
	dim, scale, neox, err := ropeArgs(op, op+": q", q, 1, at.Heads, at.HeadDim, r)
	if err != nil {
		return pa, err
	}
	kvDim := at.KVHeads * at.HeadDim
	if err := checkTensor(op+": k", k, kvDim); err != nil {
		return pa, err
	}
	if err := checkTensor(op+": v", v, kvDim); err != nil {
		return pa, err
	}
	sfx := "f16"
	if esize == 4 {
		sfx = "f32"
	}
	return prepArgs{kp: kp, vp: vp, dim: dim, scale: scale, neox: neox, sfx: sfx}, nil
}

// AttentionStoredQ8 implements kernels.QKVPreparer: attention without the
// store (PrepareQKV made it).
func (b *Backend) AttentionStoredQ8(out, q kernels.Tensor, kc *kernels.KVCache, layer, pos int, at kernels.Attn, oq kernels.Q8) (kernels.Q8, error) {
	return b.attentionFrom(out, q, kernels.Tensor{}, kernels.Tensor{}, kc, layer, pos, 1, at, oq, true)
}

var _ kernels.QKVAttender = (*Backend)(nil)

// AttendQKVQ8 implements kernels.QKVAttender: one launch of
// attn_decode_rope, which does qkv_prep's rotation and store inside the
// decode attention: each block rotates its query head in shared memory, and
// the blocks whose split holds the new position rotate the new key, use it
// and the new value as the cache would hold them, and the first query head
// of each group stores them. It declines (false, nothing queued) where
// PrepareQKV and AttentionStoredQ8 would take another kernel: a sliding
// window or a soft-cap, no 8-bit copy, fusing off.
func (b *Backend) AttendQKVQ8(out, q, k, v kernels.Tensor, kc *kernels.KVCache, layer, pos int, r kernels.Rope, at kernels.Attn, oq kernels.Q8) (kernels.Q8, bool, error) {
	const op = "attend qkv"
	if at.Window > 0 || at.Softcap > 0 || oq.Empty() || b.noFuse || at.HeadDim%32 != 0 {
		return kernels.Q8{}, false, nil
	}
	pa, err := b.checkPrep(op, q, k, v, kc, layer, pos, r, at)
	if err != nil {
		return kernels.Q8{}, false, err
	}
	qDim := at.Heads * at.HeadDim
	if err := checkTensor(op+": out", out, qDim); err != nil {
		return kernels.Q8{}, false, err
	}
	dq, err := devQ8(op, oq, 1, qDim)
	if err != nil {
		return kernels.Q8{}, false, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	sp, err := b.sinkPtr(op, at)
	if err != nil {
		return kernels.Q8{}, false, err
	}
	fp, err := b.ropeFreqs(r, pa.dim)
	if err != nil {
		return kernels.Q8{}, false, err
	}
	ro := ropeLaunch{k: dptr(k), v: dptr(v), dim: pa.dim, base: r.Base, scale: pa.scale, freqs: fp, neox: pa.neox}
	err = b.do(func(c *rocm.Ctx) error {
		return b.attnDecode(c, pa.sfx, out, q, pa.kp, pa.vp, sp, pos, 1, kc.Ctx, at, dq, &ro)
	})
	if err != nil {
		return kernels.Q8{}, false, err
	}
	return oq, true, nil
}

// cacheLayer checks kc against at and returns the device addresses of
// layer's keys and values and the element size.
func (b *Backend) cacheLayer(op string, kc *kernels.KVCache, layer int, at kernels.Attn) (kp, vp rocm.DevPtr, esize int, err error) {
	if kc == nil {
		return 0, 0, 0, fmt.Errorf("gpu: %s: nil kv cache", op)
	}
	kb, ok := kc.Impl.(*kvBuf)
	if !ok || kb.base == 0 {
		return 0, 0, 0, fmt.Errorf("gpu: %s: kv cache was not made by this backend (or was freed)", op)
	}
	if err := checkAttn(op, "cache", at, kc.KVDim, kc.Layers, layer); err != nil {
		return 0, 0, 0, err
	}
	layerBytes := int64(kc.Ctx) * int64(kc.KVDim) * int64(kb.esize)
	kp = kb.base + rocm.DevPtr(int64(2*layer)*layerBytes)
	return kp, kp + rocm.DevPtr(layerBytes), kb.esize, nil
}

// AttentionQ8 implements kernels.Q8Ops: Attention, one token's output also
// quantized into oq by the decode kernel itself (plain attention, head
// sizes of whole blocks of 32).
func (b *Backend) AttentionQ8(out, q, k, v kernels.Tensor, kc *kernels.KVCache, layer, pos0, n int, at kernels.Attn, oq kernels.Q8) (kernels.Q8, error) {
	return b.attention(out, q, k, v, kc, layer, pos0, n, at, oq)
}

func (b *Backend) attention(out, q, k, v kernels.Tensor, kc *kernels.KVCache, layer, pos0, n int, at kernels.Attn, oq kernels.Q8) (kernels.Q8, error) {
	return b.attentionFrom(out, q, k, v, kc, layer, pos0, n, at, oq, false)
}

// attentionFrom is attention; stored: the keys and values are in the
// cache already (PrepareQKV), k and v are not read.
func (b *Backend) attentionFrom(out, q, k, v kernels.Tensor, kc *kernels.KVCache, layer, pos0, n int, at kernels.Attn, oq kernels.Q8, stored bool) (kernels.Q8, error) {
	kp, vp, esize, err := b.cacheLayer("attention", kc, layer, at)
	if err != nil {
		return kernels.Q8{}, err
	}
	kvDim := at.KVHeads * at.HeadDim
	if pos0 < 0 || n < 0 || pos0+n > kc.Ctx {
		return kernels.Q8{}, fmt.Errorf("gpu: attention: positions %d…%d outside the context of %d", pos0, pos0+n-1, kc.Ctx)
	}
	qDim := at.Heads * at.HeadDim
	for _, c := range []struct {
		what string
		t    kernels.Tensor
		n    int
	}{{"q", q, n * qDim}, {"out", out, n * qDim}, {"k", k, n * kvDim}, {"v", v, n * kvDim}} {
		if stored && (c.what == "k" || c.what == "v") {
			continue
		}
		if err := checkTensor("attention: "+c.what, c.t, c.n); err != nil {
			return kernels.Q8{}, err
		}
	}
	if n == 0 {
		return kernels.Q8{}, nil
	}
	dq, err := devQ8("attention", oq, n, qDim)
	if err != nil {
		return kernels.Q8{}, err
	}
	// One token's output is also quantized for the output projection.
	if !(n == 1 && at.Plain() && at.HeadDim%32 == 0 && !b.noFuse) {
		dq, oq = q8x{}, kernels.Q8{}
	}
	sfx := "f16"
	if esize == 4 {
		sfx = "f32"
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.step.on && n > 2 {
		return kernels.Q8{}, fmt.Errorf("gpu: attention of %d tokens in a decode step", n)
	}
	sp, err := b.sinkPtr("attention", at)
	if err != nil {
		return kernels.Q8{}, err
	}
	err = b.do(func(c *rocm.Ctx) error {
		var a rocm.Args
		if !stored {
			a.Ptr(kp).Ptr(vp).Ptr(dptr(k)).Ptr(dptr(v)).I32(int32(n)).I32(int32(kvDim)).I32(int32(pos0)).Ptr(b.stepPos())
			if err := b.launch(c, "kv_store_"+sfx, grid1(n*kvDim), rocm.D1(256), &a); err != nil {
				return err
			}
			a.Reset()
		}
		if at.Window > 0 || at.Softcap > 0 { // a sliding window or a soft-cap, and any sinks (archops.go)
			return b.attnExt(c, sfx, out, q, kp, vp, sp, pos0, n, at)
		}
		if n <= 2 {
			return b.attnDecode(c, sfx, out, q, kp, vp, sp, pos0, n, kc.Ctx, at, dq, nil)
		}
		a.Ptr(dptr(out)).Ptr(dptr(q)).Ptr(kp).Ptr(vp).I32(int32(n)).I32(int32(at.Heads)).I32(int32(at.KVHeads)).
			I32(int32(at.HeadDim)).I32(int32(pos0)).F32(at.Scale).Ptr(sp)
		l := planAttnPrompt(sfx, at.Heads, n)
		return b.launch(c, l.Kernel, l.Grid, l.Block, &a)
	})
	if err != nil {
		return kernels.Q8{}, err
	}
	return oq, nil
}

// attnDecode queues the decode-shape attention. The context is split over
// several blocks per head so that about four blocks per multiprocessor run
// (each split at least 64 positions of a full cache); the last block of a
// head to finish merges the splits. The grid is sized for the cache's
// whole context (ctx), not for the positions in use, so that a recorded
// decode step, which reads its position on the device, runs the very
// kernels and grid that the same step queued op by op runs: the two give
// identical results. The kernel divides the pos0+n positions in use among
// the splits (splits past the end are empty). sp is the sinks' address
// (sinkPtr; 0 for none). With oq (one token), it also quantizes the output
// into it.
//
// With ro (one token), attn_decode_rope also rotates the query and the new
// key and stores the new key and value (what qkv_prep does).
func (b *Backend) attnDecode(c *rocm.Ctx, sfx string, out, q kernels.Tensor, kp, vp, sp rocm.DevPtr, pos0, n, ctx int, at kernels.Attn, oq q8x, ro *ropeLaunch) error {
	l, splits, splitLen := planAttnDecode(b.launchDevice(), sfx, at.Heads, n, pos0, ctx, b.tune.attnMinSplit) // splitLen: as the kernel computes it from posp
	var part, count rocm.DevPtr
	if splits > 1 {
		var err error
		part, err = b.scratchBuf(c, "attn-part", int64(n*at.Heads*splits*(at.HeadDim+2)*4))
		if err != nil {
			return err
		}
		if count, err = b.zeroedScratch(c, "attn-count", int64(n*at.Heads*4)); err != nil {
			return err
		}
	}
	var a rocm.Args
	a.Ptr(dptr(out)).Ptr(part).Ptr(dptr(q)).Ptr(kp).Ptr(vp).I32(int32(at.Heads)).I32(int32(at.KVHeads)).
		I32(int32(at.HeadDim)).I32(int32(pos0)).F32(at.Scale).I32(int32(splitLen)).Ptr(b.stepPos()).Ptr(count).
		Ptr(oq.codes).Ptr(oq.scales).Ptr(sp).I32(int32(b.tune.attnMinSplit))
	if ro != nil {
		a.Ptr(ro.k).Ptr(ro.v).I32(int32(ro.dim)).F32(ro.base).F32(ro.scale).Ptr(ro.freqs).I32(ro.neox)
		return b.launch(c, "attn_decode_rope_"+sfx, l.Grid, l.Block, &a)
	}
	return b.launch(c, l.Kernel, l.Grid, l.Block, &a)
}

// ropeLaunch is what attn_decode_rope reads besides attn_decode's
// arguments: the new key and value heads and RoPE's (ropeArgs).
type ropeLaunch struct {
	k, v        rocm.DevPtr
	dim         int
	base, scale float32
	freqs       rocm.DevPtr
	neox        int32
}

func (b *Backend) elementwise(op, kernel string, dst kernels.Tensor, srcs []kernels.Tensor, n int) error {
	_, err := b.elementwiseQ8(op, kernel, "", dst, srcs, n, kernels.Q8{})
	return err
}

// elementwiseQ8 queues kernel, or fused (the same op that also quantizes
// dst to 8 bits into q, see rmsnorm_row) when fused and q are given and n
// is at most maxFusedQ8 values (q's rows: one token's row, as in decode,
// or a few rows of a batched step's; a prompt's rows go through the GEMM,
// which reads floats); it returns q when it filled it.
func (b *Backend) elementwiseQ8(op, kernel, fused string, dst kernels.Tensor, srcs []kernels.Tensor, n int, q kernels.Q8) (kernels.Q8, error) {
	if err := checkTensor(op+": dst", dst, n); err != nil {
		return kernels.Q8{}, err
	}
	for _, s := range srcs {
		if err := checkTensor(op+": input", s, n); err != nil {
			return kernels.Q8{}, err
		}
	}
	if n <= 0 {
		return kernels.Q8{}, nil
	}
	var dq q8x
	if !q.Empty() {
		if q.Rows*q.Cols != n {
			return kernels.Q8{}, fmt.Errorf("gpu: %s: an 8-bit copy of %d×%d values for %d", op, q.Rows, q.Cols, n)
		}
		var err error
		if dq, err = devQ8(op, q, q.Rows, q.Cols); err != nil {
			return kernels.Q8{}, err
		}
	}
	if !(fused != "" && !q.Empty() && n <= maxFusedQ8 && !b.noFuse) {
		dq, q = q8x{}, kernels.Q8{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	err := b.do(func(c *rocm.Ctx) error {
		var a rocm.Args
		a.Ptr(dptr(dst))
		for _, s := range srcs {
			a.Ptr(dptr(s))
		}
		a.I32(int32(n))
		if !dq.empty() {
			a.Ptr(dq.codes).Ptr(dq.scales)
			return b.launch(c, fused, grid1(n), rocm.D1(256), &a)
		}
		return b.launch(c, kernel, grid1(n), rocm.D1(256), &a)
	})
	if err != nil {
		return kernels.Q8{}, err
	}
	return q, nil
}

// SiLUMul computes dst = silu(gate) ⊙ up over n values.
func (b *Backend) SiLUMul(dst, gate, up kernels.Tensor, n int) error {
	_, err := b.elementwiseQ8("silu·mul", "silu_mul", "", dst, []kernels.Tensor{gate, up}, n, kernels.Q8{})
	return err
}

// SiLUMulQ8 implements kernels.Q8Ops: SiLUMul, quantized on the side into q
// by silu_mul_q8 (up to maxFusedQ8 values).
func (b *Backend) SiLUMulQ8(dst, gate, up kernels.Tensor, n int, q kernels.Q8) (kernels.Q8, error) {
	return b.elementwiseQ8("silu·mul", "silu_mul", "silu_mul_q8", dst, []kernels.Tensor{gate, up}, n, q)
}

// Add computes dst = a + b over n values.
func (b *Backend) Add(dst, x, y kernels.Tensor, n int) error {
	return b.elementwise("add", "add", dst, []kernels.Tensor{x, y}, n)
}

// Argmax returns the index of the largest value of each of rows rows of
// cols values (ties: the lowest index). It waits for the result.
func (b *Backend) Argmax(x kernels.Tensor, rows, cols int) ([]int32, error) {
	if rows <= 0 || cols <= 0 {
		return nil, fmt.Errorf("gpu: argmax of %d×%d", rows, cols)
	}
	if err := checkTensor("argmax: x", x, rows*cols); err != nil {
		return nil, err
	}
	out := make([]int32, rows)
	b.mu.Lock()
	defer b.mu.Unlock()
	err := b.do(func(c *rocm.Ctx) error {
		p, err := b.scratchBuf(c, "argmax", int64(4*rows))
		if err != nil {
			return err
		}
		var a rocm.Args
		parts, ls := planArgmax(rows, cols)
		if parts > 0 {
			// One long row (a vocabulary): slices on many blocks, then
			// one block over their winners.
			pp, err := b.scratchBuf(c, "argmax-parts", int64(8*parts))
			if err != nil {
				return err
			}
			a.Ptr(dptr(x)).I32(int32(cols)).I32(argmaxChunk).Ptr(pp).Ptr(pp + rocm.DevPtr(4*parts))
			if err := b.launch(c, ls[0].Kernel, ls[0].Grid, ls[0].Block, &a); err != nil {
				return err
			}
			a.Reset()
			a.Ptr(pp).Ptr(pp + rocm.DevPtr(4*parts)).I32(int32(parts)).Ptr(p)
			if err := b.launch(c, ls[1].Kernel, ls[1].Grid, ls[1].Block, &a); err != nil {
				return err
			}
		} else {
			a.Ptr(dptr(x)).Ptr(p).I32(int32(cols))
			if err := b.launch(c, ls[0].Kernel, ls[0].Grid, ls[0].Block, &a); err != nil {
				return err
			}
		}
		if err := c.SyncStream(b.stream); err != nil {
			return err
		}
		raw := make([]byte, 4*rows)
		if err := c.CopyDtoH(raw, p); err != nil {
			return err
		}
		for i := range out {
			out[i] = int32(uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("gpu: argmax: %w", err)
	}
	return out, nil
}

// argmaxChunk is how many values one block of argmax_slices reduces.
const argmaxChunk = 1024

const topkChunk = 4096 // the kernel's TOPK_CHUNK

// TopK returns the k largest of cols values (a row of logits), in
// descending order with their indices (ties: the lower index first). It
// waits for the result. k ≤ 1024.
func (b *Backend) TopK(x kernels.Tensor, cols, k int) ([]int32, []float32, error) {
	if k <= 0 || k > cols || k > 1024 {
		return nil, nil, fmt.Errorf("gpu: top-%d of %d values", k, cols)
	}
	if err := checkTensor("top-k: x", x, cols); err != nil {
		return nil, nil, err
	}
	idx := make([]int32, k)
	vals := make([]float32, k)
	b.mu.Lock()
	defer b.mu.Unlock()
	err := b.do(func(c *rocm.Ctx) error {
		// Each step cuts count candidates to k per chunk of 4096, until one
		// chunk is left; its k best are the answer.
		maxOut := int64(ceilDiv(cols, topkChunk) * k)
		bufs := [2][2]rocm.DevPtr{}
		for i := range 2 {
			var err error
			if bufs[i][0], err = b.scratchBuf(c, fmt.Sprintf("topk-v%d", i), 4*maxOut); err != nil {
				return err
			}
			if bufs[i][1], err = b.scratchBuf(c, fmt.Sprintf("topk-i%d", i), 4*maxOut); err != nil {
				return err
			}
		}
		src, srcIdx, count := dptr(x), rocm.DevPtr(0), cols
		cur := 0
		for {
			blocks := ceilDiv(count, topkChunk)
			var a rocm.Args
			a.Ptr(src).Ptr(srcIdx).I32(int32(count)).I32(int32(k)).Ptr(bufs[cur][0]).Ptr(bufs[cur][1])
			if err := b.launch(c, "topk_step", rocm.D1(blocks), rocm.D1(256), &a); err != nil {
				return err
			}
			src, srcIdx, count = bufs[cur][0], bufs[cur][1], blocks*k
			cur ^= 1
			if blocks == 1 {
				break
			}
		}
		if err := c.SyncStream(b.stream); err != nil {
			return err
		}
		raw := make([]byte, 4*k)
		if err := c.CopyDtoH(raw, src); err != nil {
			return err
		}
		for i := range vals {
			vals[i] = math.Float32frombits(uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24)
		}
		if err := c.CopyDtoH(raw, srcIdx); err != nil {
			return err
		}
		for i := range idx {
			idx[i] = int32(uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24)
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("gpu: top-k: %w", err)
	}
	return idx, vals, nil
}
