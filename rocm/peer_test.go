package rocm

import (
	"bytes"
	"testing"
)

// TestPeerCopy: CopyPeerAsync moves bytes from one context's memory to
// another's, on the destination's stream, between two contexts of device
// 0 (what a split model's tests run on one card) and, where there are two
// devices, between devices 0 and 1 (peer access enabled where the driver
// allows it).
func TestPeerCopy(t *testing.T) {
	w0 := gpu(t)
	noLeaks(t)
	rt := w0.Runtime()
	ords := []int{0}
	if n, err := rt.DeviceCount(); err == nil && n >= 2 {
		ords = append(ords, 1)
	}
	const n = 1 << 20
	want := make([]byte, n)
	for i := range want {
		want[i] = byte(i*7 + 3)
	}
	for _, ord := range ords {
		w1, err := rt.NewWorker(ord)
		if err != nil {
			t.Fatal(err)
		}
		var src, dst DevPtr
		do(t, w0, func(c *Ctx) error {
			var err error
			if src, err = c.Malloc(n); err != nil {
				return err
			}
			return c.CopyHtoD(src, want)
		})
		got := make([]byte, n)
		var direct bool
		do(t, w1, func(c *Ctx) error {
			var err error
			if direct, err = c.EnablePeer(w0.Peer()); err != nil {
				return err
			}
			if dst, err = c.Malloc(n); err != nil {
				return err
			}
			s, err := c.NewStream()
			if err != nil {
				return err
			}
			defer c.DestroyStream(s)
			if err := c.CopyPeerAsync(dst, src, w0.Peer(), n, s); err != nil {
				return err
			}
			if err := c.SyncStream(s); err != nil {
				return err
			}
			if err := c.CopyDtoH(got, dst); err != nil {
				return err
			}
			return c.Free(dst, n)
		})
		do(t, w0, func(c *Ctx) error { return c.Free(src, n) })
		w1.Close()
		if !bytes.Equal(got, want) {
			t.Fatalf("device 0 → device %d: bytes differ", ord)
		}
		if ord == 0 && !direct {
			t.Errorf("two contexts of one device: EnablePeer reports no direct access")
		}
		t.Logf("device 0 → device %d: %d bytes copied (direct link: %v)", ord, n, direct)
	}
}
