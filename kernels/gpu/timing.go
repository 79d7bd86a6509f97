package gpu

import "github.com/forge-llm/forge/rocm"

// CopyBandwidth times a device-to-device copy of a 1 GiB buffer
// (cuMemcpyDtoDAsync / hipMemcpyDtoDAsync, 20 times after 3) and returns
// bytes read plus bytes written per second, in GB/s: the ceiling that the
// benchmarks compare a decode step's weight reads with.
func (b *Backend) CopyBandwidth() (float64, error) {
	const size, reps = 1 << 30, 20
	var gbs float64
	err := b.do(func(c *rocm.Ctx) error {
		src, err := c.Malloc(size)
		if err != nil {
			return err
		}
		defer c.Free(src, size)
		dst, err := c.Malloc(size)
		if err != nil {
			return err
		}
		defer c.Free(dst, size)
		if err := c.MemsetD8Async(src, 1, size, b.stream); err != nil {
			return err
		}
		ms, err := timeOn(c, b.stream, 3, reps, func(int) error { return c.CopyDtoDAsync(dst, src, size, b.stream) })
		if err != nil {
			return err
		}
		gbs = 2 * size * reps / (float64(ms) / 1e3) / 1e9
		return nil
	})
	return gbs, err
}

// timeOn runs warm calls of fn, then reps calls between two events, and
// returns the milliseconds the device spent on the reps.
func timeOn(c *rocm.Ctx, s rocm.Stream, warm, reps int, fn func(i int) error) (float32, error) {
	for i := range warm {
		if err := fn(i); err != nil {
			return 0, err
		}
	}
	e0, err := c.NewEvent(true)
	if err != nil {
		return 0, err
	}
	defer c.DestroyEvent(e0)
	e1, err := c.NewEvent(true)
	if err != nil {
		return 0, err
	}
	defer c.DestroyEvent(e1)
	if err := c.Record(e0, s); err != nil {
		return 0, err
	}
	for i := range reps {
		if err := fn(warm + i); err != nil {
			return 0, err
		}
	}
	if err := c.Record(e1, s); err != nil {
		return 0, err
	}
	if err := c.SyncEvent(e1); err != nil {
		return 0, err
	}
	return c.Elapsed(e0, e1)
}
