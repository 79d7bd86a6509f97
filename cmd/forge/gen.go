package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/urfave/cli/v2"
	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"

	"github.com/forge-llm/forge/pipeline/synth"
)

func init() {
	var mixes []string
	for _, m := range synth.Mixes() {
		mixes = append(mixes, string(m))
	}
	commands = append(commands, &cli.Command{
		Name:      "gen",
		Usage:     "write a synthetic GGUF model with a real model's shapes",
		ArgsUsage: " ",
		Description: "Writes the tensor names, shapes, metadata and quantization mix of a well-known model " +
			"with random (valid) weights, so that benchmarks get multi-GB models without a download. " +
			"The text such a model generates is meaningless. Presets: " + strings.Join(synth.PresetNames(), ", ") + ".",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "preset", Usage: "model shape: " + strings.Join(synth.PresetNames(), ", "), Required: true},
			&cli.StringFlag{Name: "quant", Aliases: []string{"q"}, Value: string(synth.MixQ4_KM), Usage: "quantization mix: " + strings.Join(mixes, ", ")},
			&cli.StringFlag{Name: "vocab", Usage: "GGUF file whose tokenizer to copy (default: a byte-level one)"},
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Usage: "file to write", Required: true},
			&cli.StringFlag{Name: "chat-template", Usage: "store a chat template: `NAME` (chatml, llama2, llama3, mistral) or a FILE holding one (default: --vocab's, else none)"},
			&cli.Uint64Flag{Name: "seed", Value: 1, Usage: "random seed of the weights"},
			&cli.StringFlag{Name: "fill", Value: synth.FillBlocks.String(), Usage: "blocks (random valid blocks, at disk speed) or quantize " +
				"(quantize Gaussian weights, as llama-quantize would; CPU-bound)"},
			&cli.BoolFlag{Name: "valid-utf8", Usage: "zero the output head's rows of the byte tokens 0x80-0xFF, so that greedy output is always valid UTF-8 " +
				"(servers that parse their output, such as llama-server, refuse malformed text)"},
			&cli.StringFlag{Name: "progress", Value: "auto", Usage: "auto (a bar on a terminal, else plain lines), tty or plain"},
		},
		Action: genCmd,
	})
}

func genCmd(c *cli.Context) error {
	ctx := c.Context
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, sigs := watchSignals(ctx)
	defer sigs.Stop()
	return sigs.Err(gen(ctx, c))
}

// writeModel writes the synthetic model; tests replace it to make a write
// fail midway.
var writeModel = synth.Write

// gen is forge gen once its signals are watched.
func gen(ctx context.Context, c *cli.Context) error {
	stdout, stderr := c.App.Writer, c.App.ErrWriter

	shape, ok := synth.Presets[c.String("preset")]
	if !ok {
		return usageErrorf("--preset %q: want one of %s", c.String("preset"), strings.Join(synth.PresetNames(), ", "))
	}
	mix, err := synth.ParseMix(c.String("quant"))
	if err != nil {
		return usageErrorf("--quant: %w", err)
	}
	fill, err := synth.ParseFill(c.String("fill"))
	if err != nil {
		return usageErrorf("--fill: %w", err)
	}
	o := synth.Options{Shape: shape, Mix: mix, Seed: c.Uint64("seed"), Fill: fill, ValidUTF8: c.Bool("valid-utf8"),
		Name: "synthetic " + c.String("preset") + " " + string(mix)}
	if v := c.String("vocab"); v != "" {
		if o.Vocab, err = synth.VocabFromFile(v); err != nil {
			return err
		}
		if len(o.Vocab.Tokens) > o.Shape.Vocab {
			o.Shape.Vocab = len(o.Vocab.Tokens)
		}
	}
	if t := c.String("chat-template"); t != "" {
		if o.ChatTemplate, err = templateText(t, stderr); err != nil {
			return err
		}
	}
	mode := c.String("progress")
	switch mode {
	case "auto":
		mode = progressMode(mode, stderr)
	case "tty", "plain":
	default:
		return usageErrorf("--progress %q: want auto, tty or plain", mode)
	}
	total, err := plannedSize(ctx, o)
	if err != nil {
		return err
	}
	path := c.String("output")
	fmt.Fprintf(stderr, "writing %s: %s %s, %d layers, %s parameters, %s\n", path, c.String("preset"), mix,
		shape.Layers, humanize.SIWithDigits(float64(o.Shape.Params()), 2, ""), humanize.Bytes(uint64(total)))

	// The model is written to a temporary file beside the output and
	// renamed over it only once complete and synced: a full disk, an
	// error or Ctrl-C leaves an existing file as it was.
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("gen %s: %w", path, err)
	}
	tmp := f.Name()
	cw := &countingFile{f: f}
	start := time.Now()
	done := showWriteProgress(mode, stderr, cw, total, start)
	err = writeModel(ctx, cw, o)
	if err == nil {
		err = f.Sync() // the rate is the disk's, not the page cache's
	}
	if err == nil {
		err = f.Chmod(0o644) // CreateTemp's 0600 is for the partial file only
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	elapsed := time.Since(start)
	done()
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("gen %s: %w", path, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s: %s in %s (%s/s)\n", path, humanize.Bytes(uint64(st.Size())),
		elapsed.Round(time.Millisecond), humanize.Bytes(uint64(float64(st.Size())/elapsed.Seconds())))
	return nil
}

// countingFile counts the bytes written to a file and passes Seek and
// Truncate through, so the GGUF writer still sees a seekable file.
type countingFile struct {
	f *os.File
	n atomic.Int64
}

func (c *countingFile) Write(p []byte) (int, error) {
	n, err := c.f.Write(p)
	c.n.Add(int64(n))
	return n, err
}

func (c *countingFile) Seek(off int64, whence int) (int64, error) {
	pos, err := c.f.Seek(off, whence)
	if err == nil {
		c.n.Store(pos)
	}
	return pos, err
}

func (c *countingFile) Truncate(n int64) error { return c.f.Truncate(n) }

// sizer is a writer that stores nothing: it only tracks the length of the
// file that would be written.
type sizer struct{ pos, end int64 }

func (s *sizer) Write(p []byte) (int, error) {
	s.pos += int64(len(p))
	s.end = max(s.end, s.pos)
	return len(p), nil
}

func (s *sizer) Seek(off int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
		s.pos = off
	case io.SeekCurrent:
		s.pos += off
	default:
		s.pos = s.end + off
	}
	return s.pos, nil
}

func (s *sizer) Truncate(n int64) error { s.end = n; return nil }

// plannedSize is the size of the file o describes: the writer run over a
// sizer with every tensor skipped, which costs only the metadata.
func plannedSize(ctx context.Context, o synth.Options) (int64, error) {
	o.Zero = true
	var s sizer
	if err := synth.Write(ctx, &s, o); err != nil {
		return 0, err
	}
	return s.end, nil
}

// showWriteProgress draws the write's progress (an mpb bar on a terminal,
// a line every second otherwise) until the returned function is called.
func showWriteProgress(mode string, w io.Writer, cw *countingFile, total int64, start time.Time) (done func()) {
	stopc := make(chan struct{})
	finished := make(chan struct{})
	rate := func(n int64) string {
		s := time.Since(start).Seconds()
		if s <= 0 {
			return "–"
		}
		return humanize.Bytes(uint64(float64(n)/s)) + "/s"
	}
	if mode == "tty" {
		p := mpb.New(mpb.WithOutput(w), mpb.WithWidth(60), mpb.WithRefreshRate(refresh), mpb.WithAutoRefresh())
		bar := p.AddBar(max(total, 1),
			mpb.PrependDecorators(decor.Name("write ", decor.WC{W: 6})),
			mpb.AppendDecorators(decor.Any(func(st decor.Statistics) string {
				return fmt.Sprintf(" %s / %s · %s", humanize.Bytes(uint64(st.Current)), humanize.Bytes(uint64(st.Total)), rate(st.Current))
			})))
		go func() {
			defer close(finished)
			t := time.NewTicker(refresh)
			defer t.Stop()
			for {
				select {
				case <-t.C:
					bar.SetCurrent(min(cw.n.Load(), total))
				case <-stopc:
					if n := cw.n.Load(); n >= total {
						bar.SetCurrent(total)
					} else {
						bar.Abort(false)
					}
					p.Wait()
					return
				}
			}
		}()
	} else {
		go func() {
			defer close(finished)
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-t.C:
					n := cw.n.Load()
					fmt.Fprintf(w, "written %s / %s (%.0f%%) at %s\n", humanize.Bytes(uint64(n)), humanize.Bytes(uint64(total)),
						100*float64(n)/float64(max(total, 1)), rate(n))
				case <-stopc:
					return
				}
			}
		}()
	}
	return func() {
		close(stopc)
		<-finished
	}
}
