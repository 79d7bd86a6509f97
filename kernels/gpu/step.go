package gpu

import (
	"fmt"
	"sort"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/rocm"
)

// stepState is the decode-step capture and replay of kernels.StepCapturer.
type stepState struct {
	// on: the ops being queued belong to a decode step, so the ones that
	// depend on the token or position read them from slots (see stepPos).
	on bool
	// capturing: the ops are being recorded, not run; nothing may wait for
	// the stream or allocate.
	capturing bool
	// slots holds two int32 on the device: the step's token and position,
	// set by set_step before each replay.
	slots rocm.DevPtr
	// used collects the scratch buffers the ops being captured use.
	used map[string]rocm.DevPtr
	// launches counts the kernels queued while capturing, to check the
	// graph recorded them all (see checkCaptured).
	launches int

	// batch: the ops being queued belong to a batched decode step
	// (stepbatch.go): Embed reads the layout's ids, PagedAttention's grid
	// has splits splits, and records the pool it reads (poolBase…).
	batch              bool
	splits             int
	poolBase           rocm.DevPtr
	poolBlocks, poolBS int
}

// checkCaptured is the check after a capture: a graph with fewer nodes
// than the kernels launched into it was (partly) run instead of recorded,
// and replaying it would silently repeat a stale step.
func checkCaptured(nodes, launches int) error {
	if nodes < launches {
		return fmt.Errorf("gpu: the captured step graph has %d nodes for %d kernel launches: the runtime ran work during capture instead of recording it", nodes, launches)
	}
	return nil
}

// stepGraph is the kernels.StepGraph of this backend.
type stepGraph struct {
	g *rocm.Graph
	// scratch are the scratch buffers the graph's kernels read and write:
	// if one has since grown (moved), the graph is stale.
	scratch map[string]rocm.DevPtr
	// batch is set on a recorded batched step (stepbatch.go).
	batch *batchGraph
}

var _ kernels.StepCapturer = (*Backend)(nil)

// stepPos is the device address of the position register in step mode, 0
// otherwise (the kernels then use their pos0 argument). Call with b.mu held.
func (b *Backend) stepPos() rocm.DevPtr {
	if !b.step.on {
		return 0
	}
	return b.step.slots + 4
}

// setStep queues set_step(token, pos), allocating the registers the first
// time. Call with b.mu held, on the worker.
func (b *Backend) setStep(c *rocm.Ctx, token int32, pos int) error {
	if b.step.slots == 0 {
		p, err := b.scratchBuf(c, "step", 256)
		if err != nil {
			return err
		}
		b.step.slots = p
	}
	var a rocm.Args
	a.Ptr(b.step.slots).I32(token).I32(int32(pos))
	return b.launch(c, "set_step", rocm.D1(1), rocm.D1(32), &a)
}

// CaptureStep implements kernels.StepCapturer: step runs once for real in
// step mode (which also grows every scratch buffer it needs, so that
// nothing allocates during the capture), then once more into a graph. The
// capture is relaxed: other users of the worker's thread are not refused
// their calls meanwhile.
func (b *Backend) CaptureStep(token int32, pos int, step func() error) (kernels.StepGraph, error) {
	if pos < 0 {
		return nil, fmt.Errorf("gpu: capture step at position %d", pos)
	}
	b.mu.Lock()
	if b.step.on || b.step.batch {
		b.mu.Unlock()
		return nil, fmt.Errorf("gpu: capture step: a step is already being run or captured")
	}
	err := b.do(func(c *rocm.Ctx) error {
		return b.setStep(c, token, pos)
	})
	if err == nil {
		b.step.on = true
	}
	b.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("gpu: capture step: %w", err)
	}
	err = step()
	b.mu.Lock()
	b.step.on = false
	b.mu.Unlock()
	if err != nil {
		return nil, err
	}

	sg, err := b.captureGraph(func(on bool) { b.step.on = on }, step)
	if err != nil {
		return nil, fmt.Errorf("gpu: capture step: %w", err)
	}
	return sg, nil
}

// captureGraph records step's ops into a graph without running them, with
// mode(true) set meanwhile (the step registers the ops read), and keeps
// the graph among the live ones.
func (b *Backend) captureGraph(mode func(on bool), step func() error) (*stepGraph, error) {
	b.mu.Lock()
	err := b.do(func(c *rocm.Ctx) error {
		return c.BeginCaptureMode(b.stream, rocm.CaptureRelaxed)
	})
	if err != nil {
		b.mu.Unlock()
		return nil, err
	}
	mode(true)
	b.step.capturing = true
	b.step.used = map[string]rocm.DevPtr{}
	b.step.launches = 0
	b.mu.Unlock()
	ferr := step()
	b.mu.Lock()
	defer b.mu.Unlock()
	used := b.step.used
	mode(false)
	b.step.capturing, b.step.used = false, nil
	var g *rocm.Graph
	gerr := b.do(func(c *rocm.Ctx) error {
		var err error
		g, err = c.EndCapture(b.stream) // always, so the stream leaves capture mode
		return err
	})
	if ferr == nil && gerr == nil {
		gerr = checkCaptured(g.Nodes(), b.step.launches)
	}
	if ferr != nil || gerr != nil {
		if g != nil {
			_ = b.do(func(c *rocm.Ctx) error { return c.DestroyGraph(g) })
		}
		if ferr != nil {
			return nil, ferr
		}
		return nil, gerr
	}
	sg := &stepGraph{g: g, scratch: used}
	if b.graphs == nil {
		b.graphs = map[*stepGraph]bool{}
	}
	b.graphs[sg] = true
	return sg, nil
}

// RunStep implements kernels.StepCapturer.
func (b *Backend) RunStep(g kernels.StepGraph, token int32, pos int) error {
	sg, ok := g.(*stepGraph)
	if !ok || sg == nil {
		return fmt.Errorf("gpu: run step: not a step graph of this backend")
	}
	if pos < 0 {
		return fmt.Errorf("gpu: run step at position %d", pos)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.graphs[sg] {
		return fmt.Errorf("gpu: run step: graph was freed")
	}
	if sg.batch != nil {
		return fmt.Errorf("gpu: run step: a batched step's graph (RunBatchStep)")
	}
	for key, p := range sg.scratch {
		if d, ok := b.scratch[key]; !ok || d.ptr != p {
			return fmt.Errorf("gpu: run step: scratch %q has moved since the capture: %w", key, kernels.ErrStaleStep)
		}
	}
	return b.do(func(c *rocm.Ctx) error {
		if err := b.setStep(c, token, pos); err != nil {
			return err
		}
		if b.prof != nil {
			return b.prof.timed(c, "step graph", b.stream, func() error { return c.LaunchGraph(sg.g, b.stream) })
		}
		return c.LaunchGraph(sg.g, b.stream)
	})
}

// FreeStep implements kernels.StepCapturer.
func (b *Backend) FreeStep(g kernels.StepGraph) {
	sg, ok := g.(*stepGraph)
	if !ok || sg == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.graphs[sg] {
		return
	}
	delete(b.graphs, sg)
	_ = b.do(func(c *rocm.Ctx) error {
		if err := c.SyncStream(b.stream); err != nil {
			return err
		}
		return c.DestroyGraph(sg.g)
	})
}

// maxFusedQ8 is the longest vector an element-wise op quantizes on the
// side (see elementwiseQ8).
const maxFusedQ8 = 1 << 16

// q8Buf returns the "xq" scratch for a vector of cols values: codes
// (cols rounded up to 256 bytes) then one float scale per 32.
func (b *Backend) q8Buf(c *rocm.Ctx, cols int) (codes, scales rocm.DevPtr, err error) {
	n := int64((cols + 255) &^ 255)
	p, err := b.scratchBuf(c, "xq", n+int64(cols/32)*4)
	if err != nil {
		return 0, 0, err
	}
	return p, p + rocm.DevPtr(n), nil
}

// KernelTime is the device time of every launch of one kernel while the
// profiler was on.
type KernelTime struct {
	Name     string
	Launches int
	Ms       float64 // total milliseconds
}

// profiler brackets each launch with two timing events. Events are reused
// across profiles; their times are read at Stop.
type profiler struct {
	events []rocm.Event // pairs: start, end
	names  []string
	used   int // pairs in use
}

func (p *profiler) timed(c *rocm.Ctx, name string, s rocm.Stream, fn func() error) error {
	if 2*p.used+2 > len(p.events) {
		for range 2 {
			e, err := c.NewEvent(true)
			if err != nil {
				return err
			}
			p.events = append(p.events, e)
		}
		p.names = append(p.names, "")
	}
	e0, e1 := p.events[2*p.used], p.events[2*p.used+1]
	if err := c.Record(e0, s); err != nil {
		return err
	}
	if err := fn(); err != nil {
		return fmt.Errorf("gpu: %s: %w", name, err)
	}
	if err := c.Record(e1, s); err != nil {
		return err
	}
	p.names[p.used] = name
	p.used++
	return nil
}

func (p *profiler) launch(c *rocm.Ctx, name string, fn func() error, s rocm.Stream) error {
	return p.timed(c, name, s, fn)
}

func (p *profiler) release(c *rocm.Ctx) error {
	if p == nil {
		return nil
	}
	var first error
	for _, e := range p.events {
		if err := c.DestroyEvent(e); err != nil && first == nil {
			first = err
		}
	}
	p.events, p.names, p.used = nil, nil, 0
	return first
}

// StartProfile times every kernel (and replayed step) queued from now on,
// each between two events: the launches no longer overlap their host
// overhead, so this is for finding where device time goes, not for rates.
func (b *Backend) StartProfile() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.prof == nil {
		b.prof = &profiler{}
	}
	b.prof.used = 0
}

// StopProfile waits for the queued work, stops timing and returns the time
// per kernel name, most first.
func (b *Backend) StopProfile() ([]KernelTime, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.prof
	if p == nil {
		return nil, fmt.Errorf("gpu: profile was not started")
	}
	byName := map[string]*KernelTime{}
	err := b.do(func(c *rocm.Ctx) error {
		if err := c.SyncStream(b.stream); err != nil {
			return err
		}
		for i := range p.used {
			ms, err := c.Elapsed(p.events[2*i], p.events[2*i+1])
			if err != nil {
				return err
			}
			k := byName[p.names[i]]
			if k == nil {
				k = &KernelTime{Name: p.names[i]}
				byName[p.names[i]] = k
			}
			k.Launches++
			k.Ms += float64(ms)
		}
		return p.release(c)
	})
	b.prof = nil
	if err != nil {
		return nil, fmt.Errorf("gpu: profile: %w", err)
	}
	out := make([]KernelTime, 0, len(byName))
	for _, k := range byName {
		out = append(out, *k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Ms > out[j].Ms })
	return out, nil
}

var (
	_ kernels.SharedInputMatMuler       = (*Backend)(nil)
	_ kernels.SharedInputPromptMatMuler = (*Backend)(nil)
)

// MatMuls implements kernels.SharedInputMatMuler. For one row, the Q4_K
// weights of the same width among ws (at most three) go through one launch
// of mv_q4_k_n12m, the kernel MatMul picks for each of them alone, its
// warps striding over the rows of all of them; two Q4_K weights and one
// Q6_K of at most a quarter of their rows (a Q4_K_M layer's Q, K and a
// grouped-query V) go through one launch of mv_q4_k_n12m6, each Q6_K row
// computed as MatMul's staged kernel does;
// the other weights, and every weight for more rows, go through MatMul's
// kernels. x is quantized
// once, by the first product that reads 8 bits, and that copy handed to
// the others.
func (b *Backend) MatMuls(dsts []kernels.Tensor, ws []*kernels.Weight, x kernels.Tensor, n int) error {
	return b.matMuls(dsts, ws, x, kernels.Q8{}, n, false)
}

// MatMulsQ8 implements kernels.Q8Ops: MatMuls, on xq where it is given.
func (b *Backend) MatMulsQ8(dsts []kernels.Tensor, ws []*kernels.Weight, x kernels.Tensor, xq kernels.Q8, n int) error {
	return b.matMuls(dsts, ws, x, xq, n, false)
}

// MatMulsPrompt implements kernels.SharedInputPromptMatMuler: MatMulPrompt
// for each weight (never the one launch for several), on xq where it is
// given, else x quantized at most once for them all.
func (b *Backend) MatMulsPrompt(dsts []kernels.Tensor, ws []*kernels.Weight, x kernels.Tensor, xq kernels.Q8, n int) error {
	return b.matMuls(dsts, ws, x, xq, n, true)
}

// matMuls is MatMuls (prompt unset) or MatMulsPrompt.
func (b *Backend) matMuls(dsts []kernels.Tensor, ws []*kernels.Weight, x kernels.Tensor, xq kernels.Q8, n int, prompt bool) error {
	gemm := prompt && n >= promptGEMMMinN
	if len(dsts) != len(ws) {
		return fmt.Errorf("gpu: matmuls: %d outputs for %d weights", len(dsts), len(ws))
	}
	if len(ws) == 0 || n <= 0 {
		return nil
	}
	kts := make([]string, len(ws))
	for i, w := range ws {
		if w == nil {
			return fmt.Errorf("gpu: matmuls: weight %d is nil", i)
		}
		if w.Cols != ws[0].Cols {
			return fmt.Errorf("gpu: matmuls: weights of %d and %d columns on one input", ws[0].Cols, w.Cols)
		}
		var err error
		if kts[i], err = b.checkProduct("matmuls", dsts[i], w, x, n); err != nil {
			return err
		}
	}
	cols := ws[0].Cols
	shared, err := devQ8("matmuls", xq, n, cols)
	if err != nil {
		return err
	}
	var grouped [3]int // indices into ws of the weights in the launch
	ng, q6 := 0, -1    // q6: a Q6_K weight riding with two Q4_K ones (mv_q4_k_n12m6)
	if n == 1 && !prompt && b.mvVariant == "" && b.mvBlocksPerSM == 0 {
		for i, w := range ws {
			if ng < len(grouped) && w.Type == gguf.TypeQ4_K && w.Cols%256 == 0 {
				grouped[ng] = i
				ng++
			} else if q6 < 0 && w.Type == gguf.TypeQ6_K && w.Cols%256 == 0 {
				q6 = i
			}
		}
	}
	if ng < 2 {
		ng = 0
	}
	if q6 >= 0 && (ng != 2 || 4*ws[q6].Rows > ws[grouped[0]].Rows+ws[grouped[1]].Rows) {
		// Only a small Q6_K weight rides along: on the H100, 8B's V (1024
		// rows next to 5120) decoded 3 % faster in the launch, 7B's (4096
		// next to 8192) 0.5 % slower (bench/results/2026-11-26-decode-h100.md).
		q6 = -1
	}
	if n >= vendorMinN {
		b.waitVendor()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	wps := make([]rocm.DevPtr, len(ws))
	for i, w := range ws {
		if wps[i], err = b.weightPtr(w); err != nil {
			return err
		}
	}
	if q6 >= 0 && uintptr(wps[q6])%16 != 0 {
		q6 = -1 // the staged Q6_K rows need an aligned weight: its own launch
	}
	return b.do(func(c *rocm.Ctx) error {
		if ng > 0 {
			if err := b.matvecQ4KMulti(c, dsts, ws, wps, grouped[:ng], q6, x, &shared); err != nil {
				return err
			}
		}
		for i, w := range ws {
			done := i == q6
			for _, g := range grouped[:ng] {
				done = done || g == i
			}
			if done {
				continue
			}
			if err := b.product(c, kts[i], w, wps[i], dsts[i], x, n, gemm, &shared); err != nil {
				return err
			}
		}
		return nil
	})
}

// matvecQ4KMulti queues dsts[g] = x · ws[g]ᵀ for the Q4_K weights of idx
// (2 or 3 of them, at wps) in one launch, on q's copy of x
// (q8For); with q6 ≥ 0 (two Q4_K weights), also the Q6_K weight ws[q6] in
// the third slot (mv_q4_k_n12m6). Call with b.mu held, on the worker.
func (b *Backend) matvecQ4KMulti(c *rocm.Ctx, dsts []kernels.Tensor, ws []*kernels.Weight, wps []rocm.DevPtr, idx []int, q6 int, x kernels.Tensor, q *q8x) error {
	cols := ws[idx[0]].Cols
	var wp [3]rocm.DevPtr
	var rows [3]int
	var ys [3]rocm.DevPtr
	total := 0
	for k, i := range idx {
		if uintptr(wps[i])%16 != 0 {
			return fmt.Errorf("gpu: matmuls: weight %q is not 16-byte aligned on the device", ws[i].Name)
		}
		wp[k], rows[k], ys[k] = wps[i], ws[i].Rows, dptr(dsts[i])
		total += ws[i].Rows
	}
	x8, err := b.q8For(c, dptr(x), cols, q)
	if err != nil {
		return err
	}
	kernel := "mv_q4_k_n12m"
	if q6 >= 0 {
		kernel = "mv_q4_k_n12m6"
		wp[2], rows[2], ys[2] = wps[q6], ws[q6].Rows, dptr(dsts[q6])
		total += rows[2]
	}
	var a rocm.Args
	for k := range 3 {
		a.Ptr(wp[k]).Ptr(ys[k]).I32(int32(rows[k])) // unused slots: 0 rows
	}
	a.Ptr(x8.codes).Ptr(x8.scales).I32(int32(cols))
	return b.launch(c, kernel, rocm.D1(planQ4KMulti(b.launchDevice(), total, b.tune.q4Grid)), rocm.D1(mvBlock), &a)
}
