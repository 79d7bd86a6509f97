package rocm

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The request protocol of Worker (polling, parking, waking) without a
// device: a worker whose setup binds nothing.
func fakeWorker(t testing.TB, spin time.Duration) *Worker {
	w := newWorker(&Runtime{}, DeviceInfo{})
	w.SetSpin(spin)
	var torn atomic.Bool
	if err := w.start(func(*Ctx) error { return nil }, func(*Ctx) { torn.Store(true) }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		w.Close()
		if !torn.Load() {
			t.Error("teardown did not run")
		}
	})
	return w
}

func TestWorkerProtocol(t *testing.T) {
	for _, spin := range []time.Duration{0, 20 * time.Microsecond, 50 * time.Microsecond} {
		t.Run(spin.String(), func(t *testing.T) {
			w := fakeWorker(t, spin)
			var tid atomic.Int64
			var count atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for g := 0; g < 8; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 200; i++ {
						slow := i%50 == 0 // make some callers park
						err := w.Do(context.Background(), func(*Ctx) error {
							id := int64(unix.Gettid())
							if old := tid.Swap(id); old != 0 && old != id {
								return errors.New("worker changed OS thread")
							}
							if slow {
								time.Sleep(200 * time.Microsecond)
							}
							count.Add(1)
							return nil
						})
						if err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if count.Load() != 8*200 {
				t.Fatalf("ran %d of %d", count.Load(), 8*200)
			}
			sentinel := errors.New("x")
			if err := w.Do(context.Background(), func(*Ctx) error { return sentinel }); err != sentinel {
				t.Fatalf("error not passed back: %v", err)
			}
			if err := w.Do(context.Background(), func(*Ctx) error { panic("boom") }); err == nil {
				t.Fatal("panic not turned into an error")
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
			defer cancel()
			release := make(chan struct{})
			if err := w.Do(ctx, func(*Ctx) error { <-release; return nil }); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("cancelled Do: %v", err)
			}
			close(release)
			if err := w.Do(context.Background(), func(*Ctx) error { return nil }); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestWorkerClosedDo(t *testing.T) {
	w := newWorker(&Runtime{}, DeviceInfo{})
	if err := w.start(func(*Ctx) error { return nil }, func(*Ctx) {}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	w.Close()
	if err := w.Do(context.Background(), func(*Ctx) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Fatalf("Do after Close: %v", err)
	}
	bad := newWorker(&Runtime{}, DeviceInfo{})
	if err := bad.start(func(*Ctx) error { return errors.New("no context") }, func(*Ctx) {}); err == nil {
		t.Fatal("setup error lost")
	}
}

func BenchmarkWorkerDoFake(b *testing.B) {
	for _, spin := range []time.Duration{0, 10 * time.Microsecond, 50 * time.Microsecond} {
		b.Run("spin="+spin.String(), func(b *testing.B) {
			w := fakeWorker(b, spin)
			nop := func(*Ctx) error { return nil }
			parks := w.parks.Load()
			for i := 0; i < b.N; i++ {
				if err := w.Do(context.Background(), nop); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(w.parks.Load()-parks)/float64(b.N), "parks/op")
		})
	}
}

// BenchmarkWorkerDoAfterLong: a request long enough for its caller to
// park (a step's final synchronisation) and then 100 short ones (the next
// step's launches), as a serving loop issues them; ns/op is per request,
// "parks/op" the short requests' callers that parked.
func BenchmarkWorkerDoAfterLong(b *testing.B) {
	for _, spin := range []time.Duration{10 * time.Microsecond, 50 * time.Microsecond} {
		b.Run("spin="+spin.String(), func(b *testing.B) {
			w := fakeWorker(b, spin)
			ctx := context.Background()
			long := func(*Ctx) error { time.Sleep(300 * time.Microsecond); return nil }
			nop := func(*Ctx) error { return nil }
			var short time.Duration
			var parks int64
			for i := 0; i < b.N; i++ {
				if err := w.Do(ctx, long); err != nil {
					b.Fatal(err)
				}
				p, start := w.parks.Load(), time.Now()
				for range 100 {
					if err := w.Do(ctx, nop); err != nil {
						b.Fatal(err)
					}
				}
				short += time.Since(start)
				parks += w.parks.Load() - p
			}
			b.ReportMetric(float64(short.Nanoseconds())/float64(100*b.N), "ns/short")
			b.ReportMetric(float64(parks)/float64(100*b.N), "parks/short")
		})
	}
}
