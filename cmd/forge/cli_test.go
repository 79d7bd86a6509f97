package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/forge-llm/forge/gguf/testmodels"
)

// forgeCLI runs forge in process as main does (arguments rearranged by
// forgeArgs), with stdin from the given reader (nil: none).
func forgeCLI(t *testing.T, stdin io.Reader, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var o, e bytes.Buffer
	app := newApp(&o, &e)
	if stdin != nil {
		app.Reader = stdin
	}
	// The Before hook replaces the default logger: put it back.
	prev := slog.Default()
	defer slog.SetDefault(prev)
	err = app.Run(forgeArgs(append([]string{"forge"}, args...)))
	return o.String(), e.String(), err
}

// greedy is the flags that make forge run print llama.cpp's greedy
// continuation (expectedText) of "Once upon a time".
var greedy = []string{"-n", "64", "--temp", "0", "-t", "2"}

// TestRunPromptSources: the same prompt from -p, -f FILE, -p - and -f -
// (stdin), and stdin piped with no flag, gives the same greedy text; one
// trailing newline of a file or stdin is not part of the prompt.
func TestRunPromptSources(t *testing.T) {
	m := testmodels.Path(t, "stories260K-Q4_K_M.gguf")
	want := expectedText(t) + "\n"
	file := filepath.Join(t.TempDir(), "prompt.txt")
	if err := os.WriteFile(file, []byte("Once upon a time\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		stdin string
		args  []string
	}{
		{"flag", "ignored stdin", []string{"-p", "Once upon a time"}},
		{"file", "ignored stdin", []string{"-f", file}},
		{"p-dash", "Once upon a time\n", []string{"-p", "-"}},
		{"f-dash", "Once upon a time", []string{"--file", "-"}},
		{"piped", "Once upon a time\n", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := append(append([]string{"run", "-m", m}, greedy...), c.args...)
			out, errOut, err := forgeCLI(t, strings.NewReader(c.stdin), args...)
			if err != nil {
				t.Fatal(err)
			}
			if out != want {
				t.Errorf("stdout\n got %q\nwant %q", out, want)
			}
			if !strings.Contains(errOut, "prompt 5 tok") {
				t.Errorf("stderr %q: want the 5 prompt tokens of \"Once upon a time\"", errOut)
			}
		})
	}
}

// TestRunPromptErrors: -p with -f is a usage error (status 2), a missing
// prompt file an error, both before the model loads.
func TestRunPromptErrors(t *testing.T) {
	m := testmodels.Path(t, "stories260K-Q4_K_M.gguf")
	_, _, err := forgeCLI(t, strings.NewReader(""), "run", "-m", m, "-p", "x", "-f", "x.txt")
	if err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), "-p and -f") {
		t.Errorf("-p with -f: %v (status %d), want a usage error naming both", err, exitCode(err))
	}
	_, _, err = forgeCLI(t, strings.NewReader(""), "run", "-m", m, "-f", filepath.Join(t.TempDir(), "none.txt"))
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing prompt file: %v, want a not-exist error", err)
	}
}

// TestRunModelPositional: the model as the positional argument, before or
// after the flags, with llama.cpp's -c and -t spellings; -m and MODEL
// together, or no model, are usage errors.
func TestRunModelPositional(t *testing.T) {
	m := testmodels.Path(t, "stories260K-Q4_K_M.gguf")
	want := expectedText(t) + "\n"
	for _, args := range [][]string{
		{"run", m, "-p", "Once upon a time", "-n", "64", "--temp", "0", "-t", "2", "-c", "256"},
		{"run", "-p", "Once upon a time", "-n", "64", "--temp", "0", "--threads", "2", "--ctx-size", "256", m},
	} {
		out, _, err := forgeCLI(t, nil, args...)
		if err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		if out != want {
			t.Errorf("%q: stdout\n got %q\nwant %q", args, out, want)
		}
	}
	for _, args := range [][]string{
		{"run", "-m", m, m, "-p", "x"},
		{"run", "-p", "x"},
		{"run", m, m, "-p", "x"},
	} {
		if _, _, err := forgeCLI(t, strings.NewReader(""), args...); exitCode(err) != 2 {
			t.Errorf("%q: %v (status %d), want a usage error", args, err, exitCode(err))
		}
	}
	// -c is the same range-checked flag as --ctx.
	if _, _, err := forgeCLI(t, nil, "run", m, "-p", "x", "-c", "-1"); exitCode(err) != 2 || !strings.Contains(err.Error(), "--ctx") {
		t.Errorf("-c -1: %v, want the --ctx usage error", err)
	}
}

// fakeStores lays out an Ollama store and a Hugging Face cache holding
// the bundled model, and points forge at them through the environment.
func fakeStores(t *testing.T) string {
	t.Helper()
	src, err := os.ReadFile(testmodels.Path(t, "stories260K-Q4_K_M.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	put := func(path string, data []byte) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ollama, hf := t.TempDir(), t.TempDir()
	put(filepath.Join(ollama, "blobs", "sha256-abc123"), src)
	put(filepath.Join(ollama, "manifests", "registry.ollama.ai", "library", "stories", "260k"),
		[]byte(`{"layers":[{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:abc123","size":1}]}`))
	snap := filepath.Join(hf, "models--tiny--stories-GGUF", "snapshots", "rev1")
	put(filepath.Join(hf, "models--tiny--stories-GGUF", "refs", "main"), []byte("rev1\n"))
	put(filepath.Join(snap, "stories260K-Q4_K_M.gguf"), src)
	put(filepath.Join(snap, "stories260K-Q8_0.gguf"), src)
	t.Setenv("OLLAMA_MODELS", ollama)
	t.Setenv("HF_HUB_CACHE", hf)
	return filepath.Join(ollama, "blobs", "sha256-abc123")
}

// TestModelStoreNames: run, inspect, tokenize and bench load take an
// Ollama name:tag or a Hugging Face org/name:QUANT where they take a file.
func TestModelStoreNames(t *testing.T) {
	blob := fakeStores(t)
	want := expectedText(t) + "\n"
	for _, name := range []string{"stories:260k", "tiny/stories-GGUF:Q4_K_M"} {
		out, _, err := forgeCLI(t, nil, append([]string{"run", name, "-p", "Once upon a time"}, greedy...)...)
		if err != nil || out != want {
			t.Errorf("run %s: %q, %v; want %q", name, out, err, want)
		}
		out, _, err = forgeCLI(t, nil, "tokenize", "-m", name, "-p", "Once upon a time", "--bos")
		if err != nil || out != "1 403 407 261 378\n" {
			t.Errorf("tokenize -m %s: %q, %v", name, out, err)
		}
	}
	for _, args := range [][]string{{"inspect", "stories:260k", "--json"}, {"inspect", "--json", "-m", "stories"}} {
		if args[len(args)-1] == "stories" {
			args[len(args)-1] = "stories:260k"
		}
		out, _, err := forgeCLI(t, nil, args...)
		if err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		var rep inspectReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		if rep.File != blob || rep.Arch != "llama" {
			t.Errorf("%q: file %q arch %q, want %q llama", args, rep.File, rep.Arch, blob)
		}
	}
	// Unknown or ambiguous names fail before anything loads, naming the model.
	for _, args := range [][]string{
		{"run", "nosuch:tag", "-p", "x"},
		{"run", "tiny/stories-GGUF", "-p", "x"}, // two quantizations
		{"inspect", "nosuch"},
		{"tokenize", "-m", "nosuch", "-p", "x"},
		{"bench", "load", "-m", "nosuch:1b", "--runs", "1"},
	} {
		_, _, err := forgeCLI(t, strings.NewReader(""), args...)
		if err == nil || !strings.Contains(err.Error(), "model \"") {
			t.Errorf("%q: %v, want an error naming the model", args, err)
		}
	}
}

// TestRunJSON: --json prints one object at the end: the greedy text,
// its 64 ids, the prompt's 5 tokens, the stop reason and the timings.
func TestRunJSON(t *testing.T) {
	m := testmodels.Path(t, "stories260K-Q4_K_M.gguf")
	out, errOut, err := forgeCLI(t, nil, append([]string{"run", m, "-p", "Once upon a time", "--json", "--echo"}, greedy...)...)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(out, "\n") != 1 {
		t.Fatalf("stdout %q: want one JSON line", out)
	}
	var r map[string]any
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"model", "text", "tokens", "prompt_tokens", "stop", "ready_ms", "first_token_ms", "prompt_tok_s", "decode_tokens", "decode_tok_s"} {
		if _, ok := r[k]; !ok {
			t.Errorf("result lacks %q: %s", k, out)
		}
	}
	var res runResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if res.Text != expectedText(t) || len(res.Tokens) != 64 || res.PromptTokens != 5 || res.Stop != "max_tokens" ||
		res.DecodeTokens != 63 || res.Model != m {
		t.Errorf("result %+v", res)
	}
	if res.ReadyMS <= 0 || res.FirstTokenMS < res.ReadyMS || res.PromptTokS <= 0 || res.DecodeTokS <= 0 {
		t.Errorf("timings: %+v", res)
	}
	if !strings.Contains(errOut, "stop max_tokens") {
		t.Errorf("stderr %q lacks the statistics line", errOut)
	}
}

func TestReorderArgs(t *testing.T) {
	cases := []struct{ in, want string }{
		// Flags after the model move before it; values go with their flag.
		{"forge run m.gguf -p hi -n 5", "forge run -p hi -n 5 m.gguf"},
		{"forge run -p - m.gguf --json", "forge run -p - --json m.gguf"},
		{"forge run m.gguf -p -v", "forge run -p -v m.gguf"}, // -v is -p's value
		// Global flags after the subcommand move before it.
		{"forge run -v m.gguf --log-level warn", "forge -v --log-level warn run m.gguf"},
		{"forge inspect m.gguf --log-format=json --json", "forge --log-format=json inspect --json m.gguf"},
		{"forge -v bench load -m a --runs 1 -v", "forge -v -v bench load -m a --runs 1"},
		// "--" ends the flags.
		{"forge run m.gguf -- -p", "forge run -- m.gguf -p"},
		// Unknown commands and no command are left alone.
		{"forge nosuch -v x", "forge nosuch -v x"},
		{"forge --version", "forge --version"},
		{"forge --log-level debug", "forge --log-level debug"},
	}
	for _, c := range cases {
		got := strings.Join(forgeArgs(strings.Fields(c.in)), " ")
		if got != c.want {
			t.Errorf("%s\n got %s\nwant %s", c.in, got, c.want)
		}
	}
}

func TestVersion(t *testing.T) {
	out, _, err := forgeCLI(t, nil, "--version")
	if err != nil || !strings.HasPrefix(out, "forge version ") {
		t.Errorf("--version: %q, %v", out, err)
	}
	if got := strings.TrimSpace(strings.TrimPrefix(out, "forge version ")); got != version() {
		t.Errorf("--version prints %q, want %q", got, version())
	}
	bi := func(v string, kv ...string) *debug.BuildInfo {
		b := &debug.BuildInfo{Main: debug.Module{Version: v}}
		for i := 0; i < len(kv); i += 2 {
			b.Settings = append(b.Settings, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return b
	}
	for _, c := range []struct {
		info *debug.BuildInfo
		ok   bool
		want string
	}{
		{nil, false, "devel"},
		{bi(""), true, "devel"},
		{bi("(devel)", "vcs.revision", "0123456789abcdef0123", "vcs.modified", "false"), true, "devel (commit 0123456789ab)"},
		{bi("v0.3.1", "vcs.revision", "abc", "vcs.modified", "true"), true, "v0.3.1 (commit abc-dirty)"},
		{bi("v0.3.1"), true, "v0.3.1"},
	} {
		if got := versionOf(c.info, c.ok); got != c.want {
			t.Errorf("versionOf(%+v) = %q, want %q", c.info, got, c.want)
		}
	}
}

// TestLogFlags: --log-level and --log-format, before or after the
// subcommand, set the default logger; -v still means debug; a bad value
// is a usage error.
func TestLogFlags(t *testing.T) {
	var buf bytes.Buffer
	l, err := newLogger(&buf, "warn", "json", false)
	if err != nil {
		t.Fatal(err)
	}
	l.Info("hidden")
	l.Warn("shown", "k", 1)
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil || rec["msg"] != "shown" || rec["level"] != "WARN" {
		t.Errorf("warn/json logger wrote %q (%v)", buf.String(), err)
	}
	if l, _ := newLogger(&buf, "error", "text", true); !l.Enabled(t.Context(), slog.LevelDebug) {
		t.Error("-v does not enable debug")
	}
	m := testmodels.Path(t, "stories260K-Q4_K_M.gguf")
	// The app's Before hook sets the logger the command sees.
	var got slog.Level = 99
	var o, e bytes.Buffer
	app := newApp(&o, &e)
	app.Commands = []*cli.Command{{Name: "probe", Flags: []cli.Flag{&cli.StringFlag{Name: "model"}}, Action: func(c *cli.Context) error {
		for _, lv := range []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError} {
			if slog.Default().Enabled(c.Context, lv) {
				got = lv
				return nil
			}
		}
		return nil
	}}}
	prev := slog.Default()
	defer slog.SetDefault(prev)
	args := reorderArgs([]string{"forge", "probe", "--model", m, "--log-level", "error", "--log-format", "json"}, app.Commands, globalFlags())
	if err := app.Run(args); err != nil || got != slog.LevelError {
		t.Errorf("probe --log-level error: level %v, %v", got, err)
	}
	for _, args := range [][]string{{"--log-level", "loud", "inspect", m}, {"inspect", m, "--log-format", "xml"}} {
		if _, _, err := forgeCLI(t, nil, args...); exitCode(err) != 2 {
			t.Errorf("%q: %v (status %d), want a usage error", args, err, exitCode(err))
		}
	}
	// A global flag after the subcommand works on a real command.
	if out, _, err := forgeCLI(t, nil, "inspect", m, "-v", "--json"); err != nil || !strings.Contains(out, `"arch": "llama"`) {
		t.Errorf("inspect MODEL -v --json: %v", err)
	}
}

// TestFloatDefaultsHelp: help shows float defaults as typed.
func TestFloatDefaultsHelp(t *testing.T) {
	out, _, err := forgeCLI(t, nil, "run", "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"--temp value", "(default: 0.8)", "(default: 0.95)", "(default: 0.05)", "penalty on recently seen tokens (1: off) (default: 1)\n"} {
		if !strings.Contains(out, s) {
			t.Errorf("run --help lacks %q", s)
		}
	}
	if strings.Contains(out, "0000") {
		t.Errorf("run --help prints a float32 widened to float64:\n%s", out)
	}
}

// TestServeAddr: --host and --port build the address; with --addr they
// are a usage error; serve takes -t and -c.
func TestServeAddr(t *testing.T) {
	var serveCmd *cli.Command
	for _, c := range commands {
		if c.Name == "serve" {
			serveCmd = c
		}
	}
	for _, n := range []string{"t", "threads", "c", "ctx-size", "ctx", "host", "port"} {
		if !slices.ContainsFunc(serveCmd.Flags, func(f cli.Flag) bool { return slices.Contains(f.Names(), n) }) {
			t.Errorf("serve has no flag %q", n)
		}
	}
	addr := func(args ...string) (string, error) {
		var got string
		var gerr error
		app := &cli.App{Name: "serve", Flags: serveCmd.Flags, Writer: io.Discard, ErrWriter: io.Discard,
			Action: func(c *cli.Context) error { got, gerr = serveAddr(c); return nil }}
		if err := app.Run(append([]string{"serve"}, args...)); err != nil {
			return "", err
		}
		return got, gerr
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "127.0.0.1:8080"},
		{[]string{"--addr", "0.0.0.0:9"}, "0.0.0.0:9"},
		{[]string{"--port", "9090"}, "127.0.0.1:9090"},
		{[]string{"--host", "0.0.0.0"}, "0.0.0.0:8080"},
		{[]string{"--host", "::1", "--port", "0"}, "[::1]:0"},
	} {
		if got, err := addr(c.args...); err != nil || got != c.want {
			t.Errorf("%q: %q, %v; want %q", c.args, got, err, c.want)
		}
	}
	for _, args := range [][]string{{"--addr", "a:1", "--port", "2"}, {"--addr", "a:1", "--host", "b"}, {"--port", "70000"}, {"--host", ""}} {
		if _, err := addr(args...); exitCode(err) != 2 {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
}

// TestCPUProfileFlag: the hidden --cpu-profile writes a profile (gzip'd,
// as runtime/pprof writes one) without changing the command's output; a
// path that can not be made is a usage error naming the flag.
func TestCPUProfileFlag(t *testing.T) {
	m := testmodels.Path(t, "stories260K-Q4_K_M.gguf")
	prof := filepath.Join(t.TempDir(), "cpu.prof")
	out, _, err := forgeCLI(t, nil, append([]string{"run", m, "-p", "Once upon a time", "--cpu-profile", prof}, greedy...)...)
	if err != nil {
		t.Fatal(err)
	}
	if want := expectedText(t) + "\n"; out != want {
		t.Errorf("output with --cpu-profile %q, want %q", out, want)
	}
	b, err := os.ReadFile(prof)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Errorf("the profile (%d bytes) is not gzip'd as runtime/pprof writes it", len(b))
	}
	_, _, err = forgeCLI(t, nil, "--cpu-profile", filepath.Join(t.TempDir(), "missing", "cpu.prof"), "run", m, "-p", "hi")
	if exitCode(err) != 2 || err == nil || !strings.Contains(err.Error(), "--cpu-profile") {
		t.Errorf("a profile in a missing folder: %v (exit %d), want a usage error naming --cpu-profile", err, exitCode(err))
	}
}
