package actors

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/edsrzf/mmap-go"

	"github.com/forge-llm/forge/gguf"
)

// BenchmarkPageIn compares making a page-cached file's mapping resident by
// touching every page with one MADV_POPULATE_READ call per 4 MiB chunk
// (fresh mapping each iteration; the file stays in page cache).
func BenchmarkPageIn(b *testing.B) {
	const size = 256 << 20
	path := filepath.Join(b.TempDir(), "data")
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	if err := os.WriteFile(path, buf, 0o600); err != nil {
		b.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	for _, c := range []struct {
		name string
		fn   func([]byte) error
	}{{"touch", touch}, {"populate", pageIn}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				m, err := mmap.Map(f, mmap.RDONLY, 0)
				if err != nil {
					b.Fatal(err)
				}
				for off := 0; off < size; off += 4 << 20 {
					if err := c.fn(m[off : off+4<<20]); err != nil {
						b.Fatal(err)
					}
				}
				m.Unmap()
			}
		})
	}
}

// TestPageInTruncated: both ways of paging in report pages past the end of
// a file truncated under its mapping as errors instead of crashing.
func TestPageInTruncated(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(path, make([]byte, 64<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := mmap.Map(f, mmap.RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unmap()
	if err := os.Truncate(path, 8<<10); err != nil {
		t.Fatal(err)
	}
	for name, fn := range map[string]func([]byte) error{"touch": touch, "pageIn": pageIn} {
		if err := fn(m[:8<<10]); err != nil {
			t.Errorf("%s of the remaining pages: %v", name, err)
		}
		if err := fn(m[16<<10 : 32<<10]); !errors.Is(err, gguf.ErrMappingFault) {
			t.Errorf("%s of pages past the end: %v, want a gguf.FaultError", name, err)
		}
	}
}
