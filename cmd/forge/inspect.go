package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/dustin/go-humanize"
	"github.com/urfave/cli/v2"

	"github.com/forge-llm/forge/dequant"
	"github.com/forge-llm/forge/gguf"
)

func init() {
	commands = append(commands, &cli.Command{
		Name:      "inspect",
		Usage:     "show a GGUF file's summary, metadata and tensors",
		ArgsUsage: "MODEL [--json] [--dump NAME]",
		Description: "Reads only the header (a 100 GB file opens instantly). The summary gives the " +
			"architecture, parameter count, layers, context, vocabulary and the bytes taken by each " +
			"tensor type; header + tensor bytes + padding add up to the file size. --dump writes one " +
			"tensor, dequantized, as little-endian float32 to stdout. MODEL (or -m) is a GGUF file or a " +
			"store name: an Ollama name:tag, or a Hugging Face cache org/name[:QUANT].",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "model", Aliases: []string{"m"}, Usage: "GGUF file or store `NAME` (or give it as MODEL)"},
			&cli.BoolFlag{Name: "json", Usage: "print the same as JSON"},
			&cli.StringFlag{Name: "dump", Usage: "write tensor `NAME` as little-endian float32 to stdout"},
		},
		Action: inspectCmd,
	})
}

// inspectArgs picks FILE and the flags from the arguments; flags may follow
// FILE ("forge inspect model.gguf --json"), which urfave/cli leaves unparsed.
func inspectArgs(c *cli.Context) (path string, asJSON bool, dump string, err error) {
	asJSON, dump = c.Bool("json"), c.String("dump")
	args := c.Args().Slice()
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--json" || a == "-json":
			asJSON = true
		case a == "--dump" || a == "-dump":
			if i+1 == len(args) {
				return "", false, "", fmt.Errorf("inspect: --dump needs a tensor name")
			}
			dump = args[i+1]
			i++
		case strings.HasPrefix(a, "--dump=") || strings.HasPrefix(a, "-dump="):
			dump = a[strings.Index(a, "=")+1:]
		case strings.HasPrefix(a, "-") && len(a) > 1:
			return "", false, "", fmt.Errorf("inspect: unknown flag %s", a)
		default:
			if path != "" {
				return "", false, "", fmt.Errorf("inspect: one FILE expected, got %q and %q", path, a)
			}
			path = a
		}
	}
	if m := c.String("model"); m != "" {
		if path != "" {
			return "", false, "", usageErrorf("inspect: model given twice: -m %q and %q", m, path)
		}
		path = m
	}
	if path == "" {
		return "", false, "", fmt.Errorf("inspect: FILE missing: give a GGUF file or a store name (usage: forge inspect MODEL [--json] [--dump NAME])")
	}
	path, err = resolveModel(path)
	if err != nil {
		return "", false, "", fmt.Errorf("inspect: %w", err)
	}
	return path, asJSON, dump, nil
}

func inspectCmd(c *cli.Context) error {
	path, asJSON, dump, err := inspectArgs(c)
	if err != nil {
		return err
	}
	f, err := gguf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if dump != "" {
		return dumpTensor(c.App.Writer, f, dump)
	}
	rep := buildReport(f)
	if asJSON {
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		return enc.Encode(rep)
	}
	return rep.writeText(c.App.Writer)
}

// inspectReport is what inspect prints, in text or JSON.
type inspectReport struct {
	File      string `json:"file"`
	Version   uint32 `json:"version"`
	FileBytes int64  `json:"file_bytes"`
	// The file is HeaderBytes (up to the data section), then TensorBytes
	// of tensor data and PaddingBytes of alignment padding, which add up
	// to FileBytes.
	HeaderBytes  int64  `json:"header_bytes"`
	TensorBytes  uint64 `json:"tensor_bytes"`
	PaddingBytes int64  `json:"padding_bytes"`
	Alignment    uint64 `json:"alignment"`

	Arch        string `json:"arch,omitempty"`
	Name        string `json:"name,omitempty"`
	Params      uint64 `json:"params"` // elements over all tensors
	Layers      int    `json:"layers,omitempty"`
	Context     int    `json:"context,omitempty"`
	Embedding   int    `json:"embedding,omitempty"`
	Heads       int    `json:"heads,omitempty"`
	HeadsKV     int    `json:"heads_kv,omitempty"`
	Vocab       int    `json:"vocab,omitempty"`
	Tokenizer   string `json:"tokenizer,omitempty"`
	ConfigError string `json:"config_error,omitempty"`

	TensorCount int          `json:"tensor_count"`
	Types       []typeTotal  `json:"types"` // by bytes, largest first
	Metadata    []metaEntry  `json:"metadata"`
	Tensors     []tensorLine `json:"tensors"`
}

type typeTotal struct {
	Type     string  `json:"type"`
	Tensors  int     `json:"tensors"`
	Elements uint64  `json:"elements"`
	Bytes    uint64  `json:"bytes"`
	Share    float64 `json:"share"` // of the tensor bytes
}

type metaEntry struct {
	Key   string `json:"key"`
	Type  string `json:"type"`
	Value any    `json:"value"` // scalars as themselves, arrays abbreviated
	text  string
}

// arrayHead is an array abbreviated to its first elements.
type arrayHead struct {
	Elem string `json:"elem"`
	Len  uint64 `json:"len"`
	Head []any  `json:"head"`
}

type tensorLine struct {
	Name   string   `json:"name"`
	Type   string   `json:"type"`
	Dims   []uint64 `json:"dims"`
	Offset uint64   `json:"offset"` // in the data section
	Bytes  uint64   `json:"bytes"`
}

const arrayHeadLen = 8

func buildReport(f *gguf.File) *inspectReport {
	r := &inspectReport{File: f.Path, Version: f.Version, FileBytes: f.Size, Alignment: f.Alignment,
		HeaderBytes: min(f.DataOffset, f.Size), TensorCount: len(f.Tensors)}
	byType := map[gguf.Type]*typeTotal{}
	for _, t := range f.Tensors {
		tt := byType[t.Type]
		if tt == nil {
			tt = &typeTotal{Type: t.Type.String()}
			byType[t.Type] = tt
		}
		tt.Tensors++
		tt.Elements += t.Elements()
		tt.Bytes += t.Size
		r.TensorBytes += t.Size
		r.Params += t.Elements()
		r.Tensors = append(r.Tensors, tensorLine{Name: t.Name, Type: t.Type.String(), Dims: t.Dims, Offset: t.Offset, Bytes: t.Size})
	}
	r.PaddingBytes = f.Size - r.HeaderBytes - int64(r.TensorBytes)
	for _, tt := range byType {
		if r.TensorBytes > 0 {
			tt.Share = float64(tt.Bytes) / float64(r.TensorBytes)
		}
		r.Types = append(r.Types, *tt)
	}
	sort.Slice(r.Types, func(i, j int) bool {
		if r.Types[i].Bytes != r.Types[j].Bytes {
			return r.Types[i].Bytes > r.Types[j].Bytes
		}
		return r.Types[i].Type < r.Types[j].Type
	})

	if cfg, err := f.Config(); err == nil {
		r.Arch, r.Name, r.Layers, r.Context, r.Embedding = cfg.Arch, cfg.Name, cfg.BlockCount, cfg.ContextLength, cfg.EmbeddingLength
		r.Heads, r.HeadsKV, r.Vocab = cfg.HeadCount, cfg.HeadCountKV, cfg.VocabSize
	} else {
		r.ConfigError = err.Error()
		r.Arch, _ = f.String("general.architecture")
		if a, ok := f.Array("tokenizer.ggml.tokens"); ok {
			r.Vocab = int(a.Len)
		}
	}
	r.Tokenizer, _ = f.String("tokenizer.ggml.model")

	for _, kv := range f.Metadata {
		r.Metadata = append(r.Metadata, metaEntry{Key: kv.Key, Type: typeName(kv.Value), Value: jsonValue(kv.Value), text: kv.Value.Format(arrayHeadLen)})
	}
	return r
}

func typeName(v gguf.Value) string {
	if a, ok := v.Array(); ok {
		return fmt.Sprintf("[%v]", a.Elem)
	}
	return v.Type.String()
}

// jsonValue turns a metadata value into something encoding/json prints
// faithfully: integers as numbers, floats as numbers (NaN and ±Inf as
// strings), arrays as their first few elements.
func jsonValue(v gguf.Value) any {
	if a, ok := v.Array(); ok {
		h := arrayHead{Elem: a.Elem.String(), Len: a.Len, Head: []any{}}
		vals, err := a.Head(arrayHeadLen)
		if err == nil {
			for _, e := range vals {
				h.Head = append(h.Head, jsonValue(e))
			}
		}
		return h
	}
	if s, ok := v.Text(); ok {
		return s
	}
	if b, ok := v.Bool(); ok {
		return b
	}
	if x, ok := v.Float(); ok {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return fmt.Sprint(x)
		}
		return json.Number(v.String()) // float32 in its shortest form
	}
	if x, ok := v.Int(); ok {
		return x
	}
	if x, ok := v.Uint(); ok {
		return x
	}
	return nil
}

func (r *inspectReport) writeText(w io.Writer) error {
	bw := bufio.NewWriter(w)
	tw := tabwriter.NewWriter(bw, 0, 0, 2, ' ', 0)
	p := func(format string, args ...any) { fmt.Fprintf(tw, format, args...) }

	p("file\t%s\n", r.File)
	p("format\tGGUF v%d, alignment %d\n", r.Version, r.Alignment)
	p("size\t%s bytes (%s) = header %s + tensors %s + padding %s\n", humanize.Comma(r.FileBytes), humanize.IBytes(uint64(r.FileBytes)),
		humanize.Comma(r.HeaderBytes), humanize.Comma(int64(r.TensorBytes)), humanize.Comma(r.PaddingBytes))
	arch := r.Arch
	if r.Name != "" {
		arch += fmt.Sprintf(" (%q)", r.Name)
	}
	p("architecture\t%s\n", arch)
	p("parameters\t%s (%s)\n", humanize.Comma(int64(r.Params)), shortCount(r.Params))
	if r.ConfigError == "" {
		p("layers\t%d\n", r.Layers)
		p("context\t%d\n", r.Context)
		p("embedding\t%d\n", r.Embedding)
		p("heads\t%d (%d KV)\n", r.Heads, r.HeadsKV)
	} else {
		p("config\t%s\n", r.ConfigError)
	}
	voc := fmt.Sprint(r.Vocab)
	if r.Tokenizer != "" {
		voc += fmt.Sprintf(" (%s tokenizer)", r.Tokenizer)
	}
	p("vocabulary\t%s\n", voc)
	p("tensors\t%d\n", r.TensorCount)
	tw.Flush()

	fmt.Fprintf(bw, "\nquantization mix (bytes per type):\n")
	tw = tabwriter.NewWriter(bw, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "  type\ttensors\telements\tbytes\tshare\t\n")
	for _, t := range r.Types {
		fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%.1f%%\t\n", t.Type, t.Tensors, humanize.Comma(int64(t.Elements)), humanize.Comma(int64(t.Bytes)), 100*t.Share)
	}
	fmt.Fprintf(tw, "  total\t%d\t%s\t%s\t\t\n", r.TensorCount, humanize.Comma(int64(r.Params)), humanize.Comma(int64(r.TensorBytes)))
	tw.Flush()

	fmt.Fprintf(bw, "\nmetadata (%d):\n", len(r.Metadata))
	tw = tabwriter.NewWriter(bw, 0, 0, 2, ' ', 0)
	for _, m := range r.Metadata {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", m.Key, m.Type, strings.ReplaceAll(m.text, "\n", `\n`))
	}
	tw.Flush()

	fmt.Fprintf(bw, "\ntensors (%d):\n", r.TensorCount)
	tw = tabwriter.NewWriter(bw, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  #\tname\ttype\tdims\toffset\tbytes\n")
	for i, t := range r.Tensors {
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%v\t%d\t%s\n", i, t.Name, t.Type, t.Dims, t.Offset, humanize.Comma(int64(t.Bytes)))
	}
	tw.Flush()
	return bw.Flush()
}

// shortCount writes 261632 as "262K", 8030261248 as "8.03B".
func shortCount(n uint64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.0fK", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}

// dumpTensor writes a tensor dequantized to little-endian float32, a few
// rows at a time so a large tensor needs little memory.
func dumpTensor(w io.Writer, f *gguf.File, name string) error {
	t, ok := f.Tensor(name)
	if !ok {
		return fmt.Errorf("inspect: %s: no tensor %q", f.Path, name)
	}
	if !dequant.Supported(t.Type) {
		return fmt.Errorf("inspect: tensor %q: dequantizing %v is not supported", name, t.Type)
	}
	rowLen, rowBytes := t.Dims[0], t.RowBytes()
	rowsPer := max(1, (1<<20)/rowLen) // about 1M elements per step
	src := make([]byte, rowsPer*rowBytes)
	dst := make([]float32, rowsPer*rowLen)
	out := make([]byte, 4*len(dst))
	bw := bufio.NewWriterSize(w, 1<<20)
	for row := uint64(0); row < t.Rows(); row += rowsPer {
		n := min(rowsPer, t.Rows()-row)
		s, d := src[:n*rowBytes], dst[:n*rowLen]
		if err := f.ReadTensor(t, row*rowBytes, s); err != nil {
			return err
		}
		if err := dequant.ToFloat32(t.Type, s, d); err != nil {
			return fmt.Errorf("inspect: tensor %q rows %d..%d: %w", name, row, row+n, err)
		}
		o := out[:4*len(d)]
		for i, x := range d {
			binary.LittleEndian.PutUint32(o[4*i:], math.Float32bits(x))
		}
		if _, err := bw.Write(o); err != nil {
			return err
		}
	}
	return bw.Flush()
}
