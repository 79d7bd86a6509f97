package main

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"

	"github.com/forge-llm/forge/pipeline"
)

// ttyDisplay is the live display on a terminal (mpb): one bar per stage
// with bytes, rate and ETA, and a strip of every layer's state with the
// moment the model became ready. It ends at the first token, so the
// generated text starts below it.
type ttyDisplay struct {
	mu sync.Mutex // guards s: events arrive on one goroutine, mpb draws on another
	s  *stats

	w                     io.Writer
	p                     *mpb.Progress
	read, convert, upload *mpb.Bar
	strip                 *mpb.Bar
	experts               *mpb.Bar // a mixture's experts line (nil: dense)
	finishOnce            sync.Once
}

// refresh is how often the display redraws.
const refresh = 100 * time.Millisecond

func newTTYDisplay(w io.Writer, s *stats) *ttyDisplay {
	d := &ttyDisplay{s: s, w: w}
	d.p = mpb.New(mpb.WithOutput(w), mpb.WithWidth(100), mpb.WithRefreshRate(refresh), mpb.WithAutoRefresh())
	fmt.Fprintf(d.p, "loading %s (%s, %d layers, %s, %s, %s)\n", s.info.Path, s.info.Arch, s.info.Layers,
		humanize.Bytes(uint64(s.info.FileBytes)), s.info.Strategy, s.info.Device)
	d.read = d.stageBar("read", s.info.FileBytes, func() (int64, time.Duration) { return d.s.read, d.s.lastRead })
	d.convert = d.stageBar("convert", s.info.FileBytes, func() (int64, time.Duration) { return d.s.convertedIn, d.s.lastConv })
	d.upload = d.stageBar("upload", s.info.FileBytes, func() (int64, time.Duration) { return d.s.uploaded, d.s.lastUp })
	d.strip = d.p.MustAdd(1, mpb.BarFillerFunc(func(w io.Writer, _ decor.Statistics) error {
		d.mu.Lock()
		defer d.mu.Unlock()
		_, err := io.WriteString(w, d.s.strip())
		return err
	}), mpb.PrependDecorators(decor.Name("layers ", decor.WC{W: 9, C: decor.DindentRight})),
		mpb.AppendDecorators(decor.Any(func(decor.Statistics) string {
			d.mu.Lock()
			defer d.mu.Unlock()
			if d.s.ready > 0 {
				return fmt.Sprintf("  ready at %s", fmtDur(d.s.ready))
			}
			return "  loading the embedding and head…"
		})))
	if s.experts() != "" { // a mixture: its experts come after every block
		d.experts = d.p.MustAdd(1, mpb.BarFillerFunc(func(w io.Writer, _ decor.Statistics) error {
			d.mu.Lock()
			defer d.mu.Unlock()
			_, err := io.WriteString(w, d.s.experts())
			return err
		}), mpb.PrependDecorators(decor.Name("experts ", decor.WC{W: 9, C: decor.DindentRight})))
	}
	return d
}

// stageBar is one stage's bar: "read [====   ] 12 MB / 40 MB · 310 MB/s · ETA 90ms".
func (d *ttyDisplay) stageBar(name string, total int64, cur func() (int64, time.Duration)) *mpb.Bar {
	return d.p.AddBar(max(total, 1),
		mpb.PrependDecorators(decor.Name(name, decor.WC{W: 9, C: decor.DindentRight})),
		mpb.AppendDecorators(decor.Any(func(st decor.Statistics) string {
			d.mu.Lock()
			n, at := cur()
			d.mu.Unlock()
			s := fmt.Sprintf(" %s / %s", humanize.Bytes(uint64(n)), humanize.Bytes(uint64(st.Total)))
			if at <= 0 || n == 0 {
				return s
			}
			rate := float64(n) / at.Seconds()
			s += " · " + humanize.Bytes(uint64(rate)) + "/s"
			if left := st.Total - n; left > 0 {
				s += " · ETA " + fmtDur(time.Duration(float64(left)/rate*float64(time.Second)))
			} else {
				s += " · done"
			}
			return s
		})))
}

func (d *ttyDisplay) Event(e pipeline.Event) {
	d.mu.Lock()
	d.s.add(e)
	read, conv, up, upTotal := d.s.read, d.s.convertedIn, d.s.uploaded, d.s.uploadTotal()
	d.mu.Unlock()
	switch e.(type) {
	case pipeline.TensorRead:
		d.read.SetCurrent(read)
	case pipeline.TensorConverted:
		d.convert.SetCurrent(conv)
	case pipeline.TensorUploaded:
		d.upload.SetTotal(max(upTotal, 1), false)
		d.upload.SetCurrent(up)
	case pipeline.AllResident:
		d.upload.SetTotal(max(up, 1), false)
		d.upload.SetCurrent(up)
	}
}

// Finish draws the last state and ends the live display: bars that did not
// complete (a lazy load, an interrupted one) stay as they are.
func (d *ttyDisplay) Finish() {
	d.finishOnce.Do(func() {
		for _, b := range []*mpb.Bar{d.read, d.convert, d.upload, d.strip, d.experts} {
			if b == nil {
				continue
			}
			if b == d.strip || b == d.experts {
				b.SetCurrent(1)
				continue
			}
			if !b.Completed() {
				b.Abort(false)
			}
		}
		d.p.Wait()
	})
}

func (d *ttyDisplay) Close(stop string) {
	d.Finish()
	d.mu.Lock()
	defer d.mu.Unlock()
	fmt.Fprintln(d.w, d.s.line(stop))
}
