package rocm

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/ebitengine/purego"
)

// DevPtr is a device address (CUdeviceptr / hipDeviceptr_t).
type DevPtr uintptr

// live counts every driver object forge holds, so tests can assert that a
// run released everything it took (Live before == Live after).
var live struct {
	devAllocs, devBytes, hostAllocs, hostBytes, registrations atomic.Int64
	streams, events, graphs, modules, contexts                atomic.Int64
}

// LiveCounts is a snapshot of the objects currently held, process-wide.
type LiveCounts struct {
	DeviceAllocs, DeviceBytes, HostAllocs, HostBytes, Registrations int64
	Streams, Events, Graphs, Modules, Contexts                      int64
}

// Live returns the current counts.
func Live() LiveCounts {
	return LiveCounts{
		live.devAllocs.Load(), live.devBytes.Load(), live.hostAllocs.Load(), live.hostBytes.Load(), live.registrations.Load(),
		live.streams.Load(), live.events.Load(), live.graphs.Load(), live.modules.Load(), live.contexts.Load(),
	}
}

// check turns a raw result from a hot-path SyscallN into an error.
func (c *Ctx) check(cuName, hipName string, r uintptr) error {
	if int32(r) == resSuccess {
		return nil
	}
	return c.err(c.name(cuName, hipName), int32(r))
}

// Malloc allocates size bytes of device memory. Prefer one Arena per model:
// a model is hundreds of tensors and one allocation is both faster and
// impossible to leak piecemeal.
func (c *Ctx) Malloc(size int64) (DevPtr, error) {
	var p uintptr
	if err := c.call(c.name("cuMemAlloc_v2", "hipMalloc"), c.memAlloc, uintptr(unsafe.Pointer(&p)), uintptr(size)); err != nil {
		return 0, fmt.Errorf("rocm: allocating %d bytes: %w", size, err)
	}
	live.devAllocs.Add(1)
	live.devBytes.Add(size)
	return DevPtr(p), nil
}

// Free releases memory from Malloc; size must be the size allocated (it only
// keeps the live byte count right).
func (c *Ctx) Free(p DevPtr, size int64) error {
	if p == 0 {
		return nil
	}
	if err := c.call(c.name("cuMemFree_v2", "hipFree"), c.memFree, uintptr(p)); err != nil {
		return err
	}
	live.devAllocs.Add(-1)
	live.devBytes.Add(-size)
	return nil
}

// Arena is one device allocation carved into named regions by a bump
// allocator. Regions live until the arena is freed; Reset forgets them all
// (for scratch reused per step). Alloc is safe for concurrent use; it makes
// no driver call.
type Arena struct {
	Base DevPtr
	Size int64

	mu      sync.Mutex
	used    int64
	regions []Region
	byName  map[string]int
}

// Region is one named carve-out of an Arena: [Off, Off+Size) from Base.
type Region struct {
	Name string
	Off  int64
	Size int64
	Ptr  DevPtr
}

// NewArena allocates size bytes of device memory as one arena.
func (c *Ctx) NewArena(size int64) (*Arena, error) {
	p, err := c.Malloc(size)
	if err != nil {
		return nil, fmt.Errorf("rocm: arena: %w", err)
	}
	return newArena(p, size), nil
}

func newArena(base DevPtr, size int64) *Arena {
	return &Arena{Base: base, Size: size, byName: map[string]int{}}
}

// FreeArena releases the arena's memory; its regions become invalid.
func (c *Ctx) FreeArena(a *Arena) error {
	if a == nil || a.Base == 0 {
		return nil
	}
	err := c.Free(a.Base, a.Size)
	a.Base = 0
	return err
}

// DefaultAlign is the alignment of arena regions unless asked otherwise: 256
// bytes covers every vector load and matches cudaMalloc's own guarantee.
const DefaultAlign = 256

// Alloc carves size bytes aligned to align (a power of two; 0 = DefaultAlign)
// and names the region. Names are unique within an arena.
func (a *Arena) Alloc(name string, size, align int64) (Region, error) {
	if align == 0 {
		align = DefaultAlign
	}
	if align < 0 || align&(align-1) != 0 {
		return Region{}, fmt.Errorf("rocm: arena region %q: alignment %d is not a power of two", name, align)
	}
	if size < 0 {
		return Region{}, fmt.Errorf("rocm: arena region %q: negative size %d", name, size)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, dup := a.byName[name]; dup {
		return Region{}, fmt.Errorf("rocm: arena region %q allocated twice", name)
	}
	// Align the address, not just the offset: Base is at least 256-aligned
	// but a test arena may not be.
	addr := (int64(a.Base) + a.used + align - 1) &^ (align - 1)
	off := addr - int64(a.Base)
	if off+size > a.Size {
		return Region{}, fmt.Errorf("rocm: arena region %q: %d bytes at offset %d exceed the arena's %d (%d free)", name, size, off, a.Size, a.Size-a.used)
	}
	r := Region{Name: name, Off: off, Size: size, Ptr: a.Base + DevPtr(off)}
	a.used = off + size
	a.byName[name] = len(a.regions)
	a.regions = append(a.regions, r)
	return r, nil
}

// Region returns the region called name.
func (a *Arena) Region(name string) (Region, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	i, ok := a.byName[name]
	if !ok {
		return Region{}, false
	}
	return a.regions[i], true
}

// Regions returns all regions in allocation order.
func (a *Arena) Regions() []Region {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Region(nil), a.regions...)
}

// Used returns the bytes carved so far (including alignment padding).
func (a *Arena) Used() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.used
}

// Reset forgets every region, keeping the memory.
func (a *Arena) Reset() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.used = 0
	a.regions = a.regions[:0]
	clear(a.byName)
}

// HostBuf is page-locked host memory from the driver: allocate staging
// buffers once and reuse them (pinning costs ~1.6 GB/s, far slower than the
// copies it enables).
type HostBuf struct {
	Ptr  uintptr
	Size int
}

// Bytes views the buffer as a Go slice (C memory: the GC never moves it).
func (h *HostBuf) Bytes() []byte {
	return unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(nil), h.Ptr)), h.Size)
}

// HostAlloc allocates size bytes of pinned, portable host memory.
func (c *Ctx) HostAlloc(size int) (*HostBuf, error) {
	var p uintptr
	const portable = 1 // CU_MEMHOSTALLOC_PORTABLE == hipHostMallocPortable
	if err := c.call(c.name("cuMemHostAlloc", "hipHostMalloc"), c.hostAlloc, uintptr(unsafe.Pointer(&p)), uintptr(size), portable); err != nil {
		return nil, fmt.Errorf("rocm: pinning %d host bytes: %w", size, err)
	}
	live.hostAllocs.Add(1)
	live.hostBytes.Add(int64(size))
	return &HostBuf{Ptr: p, Size: size}, nil
}

// FreeHost releases a HostBuf.
func (c *Ctx) FreeHost(h *HostBuf) error {
	if h == nil || h.Ptr == 0 {
		return nil
	}
	if err := c.call(c.name("cuMemFreeHost", "hipHostFree"), c.hostFree, h.Ptr); err != nil {
		return err
	}
	live.hostAllocs.Add(-1)
	live.hostBytes.Add(-int64(h.Size))
	h.Ptr = 0
	return nil
}

// Registered is a host range (typically an mmap'd model file) page-locked in
// place, so the GPU's copy engines read it directly.
type Registered struct {
	Ptr      uintptr
	Size     int
	ReadOnly bool // registered with CU_MEMHOSTREGISTER_READ_ONLY
}

// Register page-locks b (not Go-heap memory: an mmap'd range or C memory).
// readOnly asks for CU_MEMHOSTREGISTER_READ_ONLY, needed for a PROT_READ
// mapping; where the device lacks it (DeviceInfo.ReadOnlyRegister false, and
// on HIP 5, which has no such flag) Register returns an error instead of
// silently registering writable and failing on a read-only page.
func (c *Ctx) Register(b []byte, readOnly bool) (*Registered, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("rocm: register: empty range")
	}
	const (
		portable = 0x01 // CU_MEMHOSTREGISTER_PORTABLE == hipHostRegisterPortable
		roFlag   = 0x08 // CU_MEMHOSTREGISTER_READ_ONLY
	)
	flags := uintptr(portable)
	if readOnly {
		if !c.w.Device.ReadOnlyRegister {
			return nil, fmt.Errorf("rocm: register %d bytes read-only: %s does not support read-only host registration", len(b), c.w.Device.Name)
		}
		flags |= roFlag
	}
	p := uintptr(unsafe.Pointer(&b[0]))
	if err := c.call(c.name("cuMemHostRegister_v2", "hipHostRegister"), c.hostRegister, p, uintptr(len(b)), flags); err != nil {
		return nil, fmt.Errorf("rocm: register %d bytes at %#x: %w", len(b), p, err)
	}
	live.registrations.Add(1)
	return &Registered{Ptr: p, Size: len(b), ReadOnly: readOnly}, nil
}

// Unregister undoes Register.
func (c *Ctx) Unregister(r *Registered) error {
	if r == nil || r.Ptr == 0 {
		return nil
	}
	if err := c.call(c.name("cuMemHostUnregister", "hipHostUnregister"), c.hostUnreg, r.Ptr); err != nil {
		return err
	}
	live.registrations.Add(-1)
	r.Ptr = 0
	return nil
}

// CopyHtoDAsync queues a copy of n bytes from host address src (pinned or
// registered memory, which must stay valid until the copy completes) to dst.
func (c *Ctx) CopyHtoDAsync(dst DevPtr, src uintptr, n int, s Stream) error {
	r, _, _ := purego.SyscallN(c.copyHtoDAsync, uintptr(dst), src, uintptr(n), uintptr(s))
	return c.check("cuMemcpyHtoDAsync_v2", "hipMemcpyHtoDAsync", r)
}

// CopyHtoDStream queues a copy of Go (pageable) memory to dst in stream s:
// the copy lands after s's earlier work (which may still read dst) and
// before its later work. The driver stages src before it returns, so src
// may be reused at once.
//
// A synchronous CopyHtoD from pageable memory gives no such order with a
// non-blocking stream: it may return before its transfer to the device
// has ended, and a kernel queued next in such a stream can read dst first.
func (c *Ctx) CopyHtoDStream(dst DevPtr, src []byte, s Stream) error {
	if len(src) == 0 {
		return nil
	}
	r, _, _ := purego.SyscallN(c.copyHtoDAsync, uintptr(dst), uintptr(unsafe.Pointer(&src[0])), uintptr(len(src)), uintptr(s))
	runtime.KeepAlive(src)
	return c.check("cuMemcpyHtoDAsync_v2", "hipMemcpyHtoDAsync", r)
}

// CopyDtoHAsync queues a copy of n bytes from src to pinned host address dst.
func (c *Ctx) CopyDtoHAsync(dst uintptr, src DevPtr, n int, s Stream) error {
	r, _, _ := purego.SyscallN(c.copyDtoHAsync, dst, uintptr(src), uintptr(n), uintptr(s))
	return c.check("cuMemcpyDtoHAsync_v2", "hipMemcpyDtoHAsync", r)
}

// CopyDtoDAsync queues a device-to-device copy.
func (c *Ctx) CopyDtoDAsync(dst, src DevPtr, n int, s Stream) error {
	r, _, _ := purego.SyscallN(c.copyDtoDAsync, uintptr(dst), uintptr(src), uintptr(n), uintptr(s))
	return c.check("cuMemcpyDtoDAsync_v2", "hipMemcpyDtoDAsync", r)
}

// CopyHtoD copies Go memory to the device (pageable: slow, for tests and
// benchmarks). It may return before the transfer ends, unordered with a
// non-blocking stream: data a kernel reads goes in by CopyHtoDStream.
func (c *Ctx) CopyHtoD(dst DevPtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return c.call(c.name("cuMemcpyHtoD_v2", "hipMemcpyHtoD"), c.copyHtoD, uintptr(dst), uintptr(unsafe.Pointer(&src[0])), uintptr(len(src)))
}

// CopyDtoH copies device memory into Go memory and waits.
func (c *Ctx) CopyDtoH(dst []byte, src DevPtr) error {
	if len(dst) == 0 {
		return nil
	}
	return c.call(c.name("cuMemcpyDtoH_v2", "hipMemcpyDtoH"), c.copyDtoH, uintptr(unsafe.Pointer(&dst[0])), uintptr(src), uintptr(len(dst)))
}

// MemsetD8Async sets n bytes at dst to v.
func (c *Ctx) MemsetD8Async(dst DevPtr, v byte, n int, s Stream) error {
	r, _, _ := purego.SyscallN(c.memsetD8Async, uintptr(dst), uintptr(v), uintptr(n), uintptr(s))
	return c.check("cuMemsetD8Async", "hipMemsetD8Async", r)
}

// MemsetD32Async sets n 32-bit words at dst (4-byte aligned) to v.
func (c *Ctx) MemsetD32Async(dst DevPtr, v uint32, n int, s Stream) error {
	r, _, _ := purego.SyscallN(c.memsetD32Async, uintptr(dst), uintptr(v), uintptr(n), uintptr(s))
	return c.check("cuMemsetD32Async", "hipMemsetD32Async", r)
}
