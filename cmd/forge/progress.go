package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/pipeline"
)

// loadInfo is what the display knows before the first event: the model's
// shape and how its bytes split over the units of the load (the globals,
// then each block), read from the tensor index.
type loadInfo struct {
	Path     string
	Arch     string
	Strategy string
	Device   string
	Layers   int
	// Units[0] is the globals, Units[1+i] block i: tensor counts and file
	// bytes.
	UnitTensors []int
	UnitBytes   []int64
	// Experts[i] is block i's experts that load one by one (a mixture;
	// 0 for a dense block): each stacked expert tensor is read, converted
	// and uploaded as that many pieces, counted in UnitTensors.
	Experts   []int
	FileBytes int64 // every planned tensor's bytes
	// F32Bytes is what the weights take as F32 (the host-f32 strategy's
	// upload total).
	F32Bytes int64
}

// newLoadInfo reads the tensor index of an opened file the way the
// pipeline's plan groups it.
func newLoadInfo(f *gguf.File, layers int) loadInfo {
	li := loadInfo{Layers: layers, UnitTensors: make([]int, layers+1), UnitBytes: make([]int64, layers+1), Experts: make([]int, layers)}
	for i := range f.Tensors {
		t := &f.Tensors[i]
		u := 0
		if l, inBlock, err := gguf.BlockOf(t.Name); inBlock {
			if err != nil || l >= layers {
				continue
			}
			u = 1 + l
		}
		if u > 0 && actors.Stacked(t) { // loaded expert by expert
			li.UnitTensors[u] += int(t.Dims[2])
			li.Experts[u-1] = int(t.Dims[2])
		} else {
			li.UnitTensors[u]++
		}
		li.UnitBytes[u] += int64(t.Size)
		li.FileBytes += int64(t.Size)
		li.F32Bytes += 4 * int64(t.Rows()) * int64(t.Dims[0])
	}
	return li
}

// stats gathers what the statistics line and the displays show, from the
// events alone (so every mode shows the same figures).
type stats struct {
	info loadInfo

	read, convertedIn, convertedOut, uploaded int64
	readN, convertedN, uploadedN              int
	unitRead, unitConverted, unitUploaded     []int // tensors per unit
	unitReady                                 []bool
	expertsIn                                 []int         // per block: experts resident
	ready, resident                           time.Duration // 0: not yet
	firstRead, lastRead, lastConv, lastUp     time.Duration

	reqStart, firstToken, done time.Duration
	lastToken                  time.Duration // the latest token's time, for an interrupted request (no done)
	promptTokens, tokens       int
	stop                       string
	err                        error
	// devicePeak is the most bytes the model held on its device at once
	// (pipeline.Memory's Peak: weights, KV cache, scratch), set before
	// Close; 0: unknown.
	devicePeak int64
}

func newStats(li loadInfo) *stats {
	n := len(li.UnitTensors)
	return &stats{info: li, unitRead: make([]int, n), unitConverted: make([]int, n), unitUploaded: make([]int, n), unitReady: make([]bool, n),
		expertsIn: make([]int, max(n-1, 0))}
}

func unitOf(layer int) int { return layer + 1 } // Globals (-1) is unit 0

// add folds one event in.
func (s *stats) add(e pipeline.Event) {
	switch e := e.(type) {
	case pipeline.TensorRead:
		if s.readN == 0 {
			s.firstRead = e.At
		}
		s.read += e.Bytes
		s.readN++
		s.lastRead = e.At
		if u := unitOf(e.Layer); u < len(s.unitRead) {
			s.unitRead[u]++
		}
	case pipeline.TensorConverted:
		s.convertedIn += e.InBytes
		s.convertedOut += e.OutBytes
		s.convertedN++
		s.lastConv = e.At
		if u := unitOf(e.Layer); u < len(s.unitConverted) {
			s.unitConverted[u]++
		}
	case pipeline.TensorUploaded:
		s.uploaded += e.Bytes
		s.uploadedN++
		s.lastUp = e.At
		if u := unitOf(e.Layer); u < len(s.unitUploaded) {
			s.unitUploaded[u]++
		}
	case pipeline.LayerReady:
		if u := unitOf(e.Layer); u < len(s.unitReady) {
			s.unitReady[u] = true
		}
	case pipeline.ExpertReady:
		if e.Layer >= 0 && e.Layer < len(s.expertsIn) {
			s.expertsIn[e.Layer] = e.Resident
		}
	case pipeline.ModelReady:
		s.ready = e.At
		s.unitReady[0] = true
	case pipeline.AllResident:
		s.resident = e.At
	case pipeline.RequestStarted:
		s.reqStart, s.promptTokens = e.At, e.PromptTokens
	case pipeline.FirstToken:
		s.firstToken = e.At
	case pipeline.TokenEvent:
		s.tokens, s.lastToken = e.Index+1, e.At
	case pipeline.Done:
		s.done, s.tokens, s.stop = e.At, e.Tokens, e.Stop
	case pipeline.ErrorEvent:
		if s.err == nil {
			s.err = e.Err
		}
	}
}

// uploadTotal is the upload bar's total: the converted sizes once every
// tensor is converted, before that the file's (or F32's) size.
func (s *stats) uploadTotal() int64 {
	tensors := 0
	for _, n := range s.info.UnitTensors {
		tensors += n
	}
	if s.convertedN >= tensors {
		return s.convertedOut
	}
	if s.info.Strategy == "host-f32" {
		return s.info.F32Bytes
	}
	return s.info.FileBytes
}

// unitState is one character of the layer strip: · pending, ░ reading,
// ▒ converted, ▓ uploading, █ resident.
func (s *stats) unitState(u int) rune {
	switch n := s.info.UnitTensors[u]; {
	case s.unitReady[u] && u > 0 && s.expertsIn[u-1] < s.expertsOf(u-1):
		return '▓' // a mixture's block: attention and router in, experts still coming
	case s.unitReady[u]:
		return '█'
	case s.unitUploaded[u] > 0:
		return '▓'
	case s.unitConverted[u] >= n && n > 0:
		return '▒'
	case s.unitRead[u] > 0 || s.unitConverted[u] > 0:
		return '░'
	}
	return '·'
}

// strip is the per-layer state line: G for the globals, then one
// character per block.
func (s *stats) strip() string {
	if len(s.info.UnitTensors) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("G")
	b.WriteRune(s.unitState(0))
	b.WriteString(" ")
	for u := 1; u < len(s.info.UnitTensors); u++ {
		b.WriteRune(s.unitState(u))
	}
	return b.String()
}

// expertsOf is block i's experts that load one by one (0: dense).
func (s *stats) expertsOf(i int) int {
	if i < 0 || i >= len(s.info.Experts) {
		return 0
	}
	return s.info.Experts[i]
}

// expertLevels draw a block's fraction of experts resident.
var expertLevels = []rune(" ▁▂▃▄▅▆▇█")

// experts is the experts line of a mixture: one character per block, its
// fraction of experts resident, then the total ("▂▅██ 40/64"); "" for a
// dense model.
func (s *stats) experts() string {
	var b strings.Builder
	in, of := 0, 0
	for i := range s.info.Experts {
		n := s.expertsOf(i)
		if n == 0 {
			b.WriteRune('·')
			continue
		}
		k := s.expertsIn[i]
		in, of = in+k, of+n
		b.WriteRune(expertLevels[k*(len(expertLevels)-1)/n])
	}
	if of == 0 {
		return ""
	}
	return fmt.Sprintf("%s %d/%d", b.String(), in, of)
}

// promptRate is prompt tokens per second: from the request's start to its
// first token (under prefetch this includes waiting for layers).
func (s *stats) promptRate() float64 {
	d := s.firstToken - s.reqStart
	if d <= 0 {
		return 0
	}
	return float64(s.promptTokens) / d.Seconds()
}

// decodeRate is tokens per second after the first: up to the end of the
// request, or for one interrupted (no Done event) up to its last token, so
// the rate is over the tokens decoded and the time they took.
func (s *stats) decodeRate() float64 {
	end := s.done
	if end == 0 {
		end = s.lastToken
	}
	d := end - s.firstToken
	if d <= 0 || s.tokens < 2 {
		return 0
	}
	return float64(s.tokens-1) / d.Seconds()
}

// bytesRate formats n bytes over d as "12 MB/s".
func bytesRate(n int64, d time.Duration) string {
	if d <= 0 {
		return "–"
	}
	return humanize.Bytes(uint64(float64(n)/d.Seconds())) + "/s"
}

// line is the statistics line printed after the generated text.
func (s *stats) line(stop string) string {
	var parts []string
	add := func(f string, a ...any) { parts = append(parts, fmt.Sprintf(f, a...)) }
	add("load: ready %s", fmtDur(s.ready))
	if s.resident > 0 {
		add("all resident %s", fmtDur(s.resident))
	}
	if s.firstToken > 0 {
		add("first token %s", fmtDur(s.firstToken))
	}
	add("prompt %d tok %.1f tok/s", s.promptTokens, s.promptRate())
	add("decode %d tok %.1f tok/s", max(s.tokens-1, 0), s.decodeRate())
	add("read %s (%s)", humanize.Bytes(uint64(s.read)), bytesRate(s.read, s.lastRead))
	add("placed %s", humanize.Bytes(uint64(s.uploaded)))
	if hwm := peakRSS(); hwm > 0 {
		add("peak RSS %s", humanize.IBytes(uint64(hwm)))
	}
	if s.devicePeak > 0 {
		add("device peak %s", humanize.IBytes(uint64(s.devicePeak)))
	}
	add("stop %s", stop)
	return strings.Join(parts, " · ")
}

// fmtDur rounds a duration for people: ms with one decimal below a
// second, else ms precision.
func fmtDur(d time.Duration) string {
	if d <= 0 {
		return "–"
	}
	if d < time.Second {
		return d.Round(100 * time.Microsecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// peakRSS is this process's peak resident set (VmHWM) in bytes, 0 where
// /proc is missing.
func peakRSS() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// display shows a load's progress. Event is called for every event in
// order from one goroutine; Finish ends the live part (before the
// generated text starts on a terminal) and may be called more than once;
// Close prints the statistics.
type display interface {
	Event(e pipeline.Event)
	Finish()
	Close(stop string)
}

// newDisplay picks the display of a --progress mode.
func newDisplay(mode string, w io.Writer, s *stats) (display, error) {
	switch mode {
	case "tty":
		return newTTYDisplay(w, s), nil
	case "plain":
		return &plainDisplay{w: w, s: s}, nil
	case "json":
		return newJSONDisplay(w, s), nil
	}
	return nil, fmt.Errorf("unknown --progress %q (auto, tty, plain, json)", mode)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func round1(x float64) float64 { return float64(int64(x*10+0.5)) / 10 }

func humanizeParse(s string) (uint64, error) { return humanize.ParseBytes(s) }
