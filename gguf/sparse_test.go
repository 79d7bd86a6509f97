package gguf

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// writeSparseModel writes a header shaped like a 70B Llama 3 (80 layers,
// embedding 8192, a 128,256-token vocabulary with 280,000 merges) whose
// tensors are holes: about 106 GB of file on no disk space.
func writeSparseModel(tb testing.TB, path string, layers int, embd, ff, vocab uint64) int64 {
	tb.Helper()
	out, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer out.Close()
	w := NewWriter(out)
	tokens := make([]string, vocab)
	types := make([]int32, vocab)
	for i := range tokens {
		tokens[i] = fmt.Sprintf("tok%06d", i)
		types[i] = 1
	}
	merges := make([]string, 0, 280000)
	for i := range cap(merges) {
		merges = append(merges, fmt.Sprintf("m%d n%d", i, i))
	}
	w.AddString("general.architecture", "llama")
	w.AddString("general.name", "sparse test model")
	w.AddUint32("llama.context_length", 8192)
	w.AddUint32("llama.embedding_length", uint32(embd))
	w.AddUint32("llama.block_count", uint32(layers))
	w.AddUint32("llama.feed_forward_length", uint32(ff))
	w.AddUint32("llama.attention.head_count", 64)
	w.AddUint32("llama.attention.head_count_kv", 8)
	w.AddFloat32("llama.rope.freq_base", 500000)
	w.AddFloat32("llama.attention.layer_norm_rms_epsilon", 1e-5)
	w.AddString("tokenizer.ggml.model", "gpt2")
	w.AddStrings("tokenizer.ggml.tokens", tokens)
	w.AddInt32s("tokenizer.ggml.token_type", types)
	w.AddStrings("tokenizer.ggml.merges", merges)
	kv := embd / 8
	w.AddTensor("token_embd.weight", TypeF16, embd, vocab)
	for i := range layers {
		p := fmt.Sprintf("blk.%d.", i)
		w.AddTensor(p+"attn_norm.weight", TypeF32, embd)
		w.AddTensor(p+"attn_q.weight", TypeF16, embd, embd)
		w.AddTensor(p+"attn_k.weight", TypeF16, embd, kv)
		w.AddTensor(p+"attn_v.weight", TypeF16, embd, kv)
		w.AddTensor(p+"attn_output.weight", TypeF16, embd, embd)
		w.AddTensor(p+"ffn_norm.weight", TypeF32, embd)
		w.AddTensor(p+"ffn_gate.weight", TypeQ8_0, embd, ff)
		w.AddTensor(p+"ffn_up.weight", TypeQ8_0, embd, ff)
		w.AddTensor(p+"ffn_down.weight", TypeF16, ff, embd)
	}
	w.AddTensor("output_norm.weight", TypeF32, embd)
	w.AddTensor("output.weight", TypeF16, embd, vocab)
	if err := w.WriteHeader(); err != nil {
		tb.Fatal(err)
	}
	for _, t := range w.Tensors() {
		if err := w.SkipTensorData(t.Name); err != nil {
			tb.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		tb.Fatal(err)
	}
	return w.FileSize()
}

// rssKB reads a field ("VmRSS", "VmHWM") of /proc/self/status in KiB.
func rssKB(tb testing.TB, field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		tb.Skipf("no /proc/self/status: %v", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return n
		}
	}
	tb.Fatalf("%s not in /proc/self/status", field)
	return 0
}

type sparseReport struct {
	OpenMS               float64
	RSSBeforeKB, RSSKB   int64
	HWMKB                int64
	Tensors              int
	Vocab                int
	DataOffset, FileSize int64
}

// TestOpenSparse100GB writes a 106 GB sparse model and opens it in a fresh
// child process (this test binary, re-run), so the RSS figures are those of
// a process that did nothing but open the file. The figures are logged (run
// with -v); RSS is asserted, time is not.
func TestOpenSparse100GB(t *testing.T) {
	if path := os.Getenv("GGUF_SPARSE_CHILD"); path != "" {
		sparseChild(t, path)
		return
	}
	if testing.Short() {
		t.Skip("writes a 106 GB sparse file; skipped in -short")
	}
	path := filepath.Join(t.TempDir(), "sparse.gguf")
	size := writeSparseModel(t, path, 80, 8192, 28672, 128256)
	if size < 100e9 {
		t.Fatalf("model is only %d bytes", size)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestOpenSparse100GB$", "-test.v")
	cmd.Env = append(os.Environ(), "GGUF_SPARSE_CHILD="+path)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var rep sparseReport
	for _, line := range strings.Split(string(out), "\n") {
		if j, ok := strings.CutPrefix(strings.TrimSpace(line), "REPORT "); ok {
			if err := json.Unmarshal([]byte(j), &rep); err != nil {
				t.Fatal(err)
			}
		}
	}
	if rep.Tensors != 80*9+3 || rep.FileSize != size || rep.Vocab != 128256 {
		t.Fatalf("child saw %+v\n%s", rep, out)
	}
	t.Logf("open %.1f GB sparse file (%d tensors, %.1f MB header): %.2f ms; RSS %.1f MB before, %.1f MB after (peak %.1f MB)",
		float64(size)/1e9, rep.Tensors, float64(rep.DataOffset)/1e6, rep.OpenMS,
		float64(rep.RSSBeforeKB)/1024, float64(rep.RSSKB)/1024, float64(rep.HWMKB)/1024)
	if rep.RSSKB > 50*1024 {
		t.Errorf("RSS after open %.1f MB, want under 50 MB", float64(rep.RSSKB)/1024)
	}
}

func sparseChild(t *testing.T, path string) {
	runtime.GC()
	before := rssKB(t, "VmRSS")
	start := time.Now()
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	c, err := f.Config()
	if err != nil {
		t.Fatal(err)
	}
	el := time.Since(start)
	rep := sparseReport{OpenMS: float64(el.Microseconds()) / 1000, RSSBeforeKB: before, RSSKB: rssKB(t, "VmRSS"),
		HWMKB: rssKB(t, "VmHWM"), Tensors: len(f.Tensors), Vocab: c.VocabSize, DataOffset: f.DataOffset, FileSize: f.Size}
	j, _ := json.Marshal(rep)
	fmt.Printf("REPORT %s\n", j)
	f.Close()
}

// BenchmarkOpenSparse100GB times Open (header decode + mmap) plus Config on
// the 106 GB sparse model; rss-MB is the process RSS after the opens.
func BenchmarkOpenSparse100GB(b *testing.B) {
	path := filepath.Join(b.TempDir(), "sparse.gguf")
	writeSparseModel(b, path, 80, 8192, 28672, 128256)
	runtime.GC()
	b.ResetTimer()
	for b.Loop() {
		f, err := Open(path)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := f.Config(); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
	b.ReportMetric(float64(rssKB(b, "VmRSS"))/1024, "rss-MB")
}

// countingReaderAt counts the bytes read through it.
type countingReaderAt struct {
	r interface {
		ReadAt([]byte, int64) (int, error)
	}
	n atomic.Int64
}

func (c *countingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.n.Add(int64(n))
	return n, err
}

// Opening reads the header and nothing else: a 200 MB and a 100 GB model
// with the same header layout (the same vocabulary, different dims) cost exactly the same bytes read (counted,
// not timed), which is the header rounded up to one read chunk.
func TestOpenCostIndependentOfSize(t *testing.T) {
	dir := t.TempDir()
	var read [2]int64
	for i, shape := range [][2]uint64{{256, 512}, {8192, 28672}} {
		path := filepath.Join(dir, fmt.Sprintf("m%d.gguf", i))
		size := writeSparseModel(t, path, 80, shape[0], shape[1], 128256)
		osf, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		cr := &countingReaderAt{r: osf}
		f, err := OpenReaderAt(cr, size, path)
		if err != nil {
			t.Fatal(err)
		}
		read[i] = cr.n.Load()
		if read[i] > f.DataOffset+headerChunk {
			t.Errorf("%d-byte file: read %d bytes for a %d-byte header", size, read[i], f.DataOffset)
		}
		t.Logf("file %.2f GB: header %d bytes, read %d bytes", float64(size)/1e9, f.DataOffset, read[i])
		osf.Close()
	}
	if read[0] != read[1] {
		t.Errorf("bytes read differ: %d vs %d", read[0], read[1])
	}
}
