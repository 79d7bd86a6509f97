package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/urfave/cli/v2"

	"github.com/forge-llm/forge/pipeline"
	"github.com/forge-llm/forge/pipeline/store"
)

func init() {
	commands = append(commands, &cli.Command{
		Name:  "list",
		Usage: "list the models in the local stores (Ollama's, the Hugging Face cache)",
		Description: "Lists the GGUF models that Ollama ($OLLAMA_MODELS or ~/.ollama/models) and the Hugging " +
			"Face hub cache ($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub) already hold, under " +
			"the names forge run, chat and serve take, with their size, quantization (the type holding " +
			"most of the weight bytes) and parameter count read from each file's header.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "one JSON array of {name, store, path, size, quant, params, arch}"},
		},
		Action: listCmd,
	}, &cli.Command{
		Name:  "ps",
		Usage: "show the models a running forge serve has loaded",
		Description: "Asks a running forge serve (GET /forge/status) which models it knows and what each " +
			"holds: state, memory, weights loaded, requests active, when an idle one unloads. " +
			"--api-key (or FORGE_API_KEY) is sent as a bearer token.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "url", Value: "http://127.0.0.1:8080", Usage: "the server's base URL"},
			&cli.StringFlag{Name: "api-key", EnvVars: []string{"FORGE_API_KEY"}, Usage: "bearer token for a server started with --api-key"},
			&cli.BoolFlag{Name: "all", Aliases: []string{"a"}, Usage: "also the models not loaded (unloaded, evicted, failed)"},
			&cli.BoolFlag{Name: "json", Usage: "the server's status object as it is"},
		},
		Action: psCmd,
	})
}

// listedModel is one row of forge list.
type listedModel struct {
	Name   string `json:"name"`
	Store  string `json:"store"`
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	Quant  string `json:"quant"`
	Params string `json:"params"`
	Arch   string `json:"arch"`
}

func listCmd(c *cli.Context) error {
	if c.NArg() > 0 {
		return usageErrorf("list: no arguments expected, got %q", c.Args().Slice())
	}
	entries, err := store.Default().List()
	if err != nil && len(entries) == 0 {
		return err
	}
	if err != nil {
		fmt.Fprintln(c.App.ErrWriter, "forge: warning:", err)
	}
	rows := make([]listedModel, 0, len(entries))
	for _, e := range entries {
		r := listedModel{Name: e.Name, Store: e.Store, Path: e.Path, Size: e.Size, Quant: "?", Params: "?", Arch: "?"}
		// The quantization and size of the header, as /api/tags says them.
		if f, err := modelFacts(pipeline.ModelStatus{ID: e.Name, Path: e.Path}); err == nil {
			r.Quant, r.Params, r.Arch = f.details.QuantizationLevel, f.details.ParameterSize, f.details.Family
		} else {
			fmt.Fprintf(c.App.ErrWriter, "forge: %s: %v\n", e.Name, err)
		}
		rows = append(rows, r)
	}
	w := c.App.Writer
	if c.Bool("json") {
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false)
		return enc.Encode(rows)
	}
	if len(rows) == 0 {
		fmt.Fprintln(c.App.ErrWriter, "forge: no models in the local stores (Ollama's, the Hugging Face cache)")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSIZE\tQUANT\tPARAMS\tARCH\tSTORE")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Name, humanize.Bytes(uint64(r.Size)), r.Quant, r.Params, r.Arch, r.Store)
	}
	return tw.Flush()
}

// serverStatus is GET /forge/status's answer.
type serverStatus struct {
	Models      []pipeline.ModelStatus `json:"models"`
	MemoryBytes int64                  `json:"memory_bytes"`
}

func psCmd(c *cli.Context) error {
	if c.NArg() > 0 {
		return usageErrorf("ps: no arguments expected, got %q", c.Args().Slice())
	}
	base, err := url.Parse(c.String("url"))
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return usageErrorf("--url %q: want http://HOST:PORT", c.String("url"))
	}
	ctx := c.Context
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", strings.TrimSuffix(base.String(), "/")+"/forge/status", nil)
	if err != nil {
		return fmt.Errorf("ps: %w", err)
	}
	if k := c.String("api-key"); k != "" {
		req.Header.Set("Authorization", "Bearer "+k)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("ps: is forge serve running at %s? %w", base, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("ps: reading the answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("ps: %s answered %s: %s", base, resp.Status, strings.TrimSpace(string(body)))
	}
	if c.Bool("json") {
		_, err := c.App.Writer.Write(body)
		return err
	}
	var st serverStatus
	if err := json.Unmarshal(body, &st); err != nil {
		return fmt.Errorf("ps: %s did not answer as forge serve does: %w", base, err)
	}
	tw := tabwriter.NewWriter(c.App.Writer, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tMEMORY\tLOADED\tACTIVE\tUNTIL")
	for _, m := range st.Models {
		loaded := m.State == pipeline.StateLoading || m.State == pipeline.StateReady || m.State == pipeline.StateResident
		if !loaded && !c.Bool("all") {
			continue
		}
		frac := "-"
		if m.WeightBytes > 0 {
			frac = fmt.Sprintf("%.0f%%", 100*float64(m.LoadedBytes)/float64(m.WeightBytes))
		}
		until := "-"
		switch {
		case !m.ExpiresAt.IsZero():
			until = humanize.Time(m.ExpiresAt)
		case loaded && m.KeepAlive < 0:
			until = "forever"
		}
		state := string(m.State)
		if m.Err != "" {
			state += ": " + m.Err
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", m.ID, state, humanize.IBytes(uint64(max(m.MemoryBytes, 0))), frac, m.Active, until)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.App.Writer, "total memory %s\n", humanize.IBytes(uint64(max(st.MemoryBytes, 0))))
	return err
}
