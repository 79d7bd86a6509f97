package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/forge-llm/forge/pipeline/store"
)

// Habits people bring from other command-line tools: flags after the
// arguments, global flags after the subcommand, --version, --log-level.
// urfave/cli v2 stops parsing a command's flags at its first argument and
// knows the app's flags only before the subcommand, so reorderArgs moves
// flags into place before the app parses them.

// globalFlags are the app's flags; newApp and reorderArgs share them.
func globalFlags() []cli.Flag {
	return []cli.Flag{
		&cli.BoolFlag{Name: "verbose", Aliases: []string{"v"}, Usage: "debug logs on stderr (same as --log-level debug)"},
		&cli.StringFlag{Name: "log-level", Value: "info", Usage: "least severe log level on stderr: debug, info, warn or error"},
		&cli.StringFlag{Name: "log-format", Value: "text", Usage: "log format on stderr: text or json"},
		// Hidden: where a command's host time goes (go tool pprof FILE),
		// for finding what a first token waits on; a GPU wait that spins
		// shows up as the Go frames that called it.
		&cli.StringFlag{Name: "cpu-profile", Usage: "write a CPU profile of the whole command to `FILE`", Hidden: true},
	}
}

// startCPUProfile starts --cpu-profile's profile into path; the returned
// stop writes it out ("" : nothing to do).
func startCPUProfile(path string) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, usageErrorf("--cpu-profile: %v", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpu-profile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}

func init() {
	// --version only: -v is --verbose, as it was before --version existed.
	cli.VersionFlag = &cli.BoolFlag{Name: "version", Usage: "print the version and exit"}
}

// version is the module version and VCS commit of this binary, from the
// build information the Go toolchain embeds; "devel" where there is none.
func version() string {
	info, ok := debug.ReadBuildInfo()
	return versionOf(info, ok)
}

func versionOf(info *debug.BuildInfo, ok bool) string {
	if !ok || info == nil {
		return "devel"
	}
	v := info.Main.Version
	if v == "" || v == "(devel)" {
		v = "devel"
	}
	var rev, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev == "" {
		return v
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if modified == "true" {
		rev += "-dirty"
	}
	return v + " (commit " + rev + ")"
}

// newLogger is the slog logger --log-level, --log-format and --verbose
// ask for, writing to w (stderr: stdout is for output).
func newLogger(w io.Writer, level, format string, verbose bool) (*slog.Logger, error) {
	var l slog.Level
	switch level {
	case "debug":
		l = slog.LevelDebug
	case "info":
		l = slog.LevelInfo
	case "warn":
		l = slog.LevelWarn
	case "error":
		l = slog.LevelError
	default:
		return nil, usageErrorf("--log-level %q: want debug, info, warn or error", level)
	}
	if verbose {
		l = slog.LevelDebug
	}
	o := &slog.HandlerOptions{Level: l}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, o)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, o)), nil
	}
	return nil, usageErrorf("--log-format %q: want text or json", format)
}

// flagSpec is what reorderArgs needs of a set of flags: each name (without
// dashes) and whether it takes a value.
type flagSpec map[string]bool

func specOf(flags []cli.Flag) flagSpec {
	s := flagSpec{}
	for _, f := range flags {
		takes := true
		if d, ok := f.(cli.DocGenerationFlag); ok {
			takes = d.TakesValue()
		}
		for _, n := range f.Names() {
			s[n] = takes
		}
	}
	return s
}

// flagName is the name in "-x", "--name" or "--name=value", and whether
// the value is attached; ok is false for an argument that is not a flag
// ("-" alone is an argument: stdin).
func flagName(a string) (name string, attached, ok bool) {
	if len(a) < 2 || a[0] != '-' || a == "--" {
		return "", false, false
	}
	n := strings.TrimLeft(a, "-")
	if i := strings.IndexByte(n, '='); i >= 0 {
		return n[:i], true, true
	}
	return n, false, true
}

// reorderArgs returns args (args[0] the program) rearranged so that
// urfave/cli sees what people mean:
//
//   - a global flag (-v, --log-level…) after the subcommand moves before
//     it, unless the subcommand has a flag of the same name;
//   - the subcommand's flags move before its arguments, so that
//     "forge run MODEL -p hi" reads as "forge run -p hi MODEL".
//
// A flag's value goes with it (a flag that takes a value takes the next
// argument whatever it looks like, as the flag package does). "--" ends
// the flags; the arguments after it stay arguments. Arguments of an
// unknown command are left as they are.
func reorderArgs(args []string, cmds []*cli.Command, global []cli.Flag) []string {
	if len(args) < 2 {
		return args
	}
	gs := specOf(global)
	out := []string{args[0]}
	i := 1
	// The app's own flags, before the subcommand.
	for i < len(args) {
		n, attached, ok := flagName(args[i])
		if !ok {
			break
		}
		out = append(out, args[i])
		i++
		if !attached && gs[n] && i < len(args) {
			out = append(out, args[i])
			i++
		}
	}
	if i == len(args) || args[i] == "--" {
		return args
	}
	cmd := findCommand(cmds, args[i])
	if cmd == nil {
		return args
	}
	path := []string{args[i]}
	i++
	for i < len(args) && len(cmd.Subcommands) > 0 {
		sub := findCommand(cmd.Subcommands, args[i])
		if sub == nil {
			break
		}
		cmd = sub
		path = append(path, args[i])
		i++
	}
	cs := specOf(cmd.Flags)
	var flags, positional []string
	dashdash := false
	for i < len(args) {
		a := args[i]
		i++
		if a == "--" {
			dashdash = true
			positional = append(positional, args[i:]...)
			break
		}
		n, attached, ok := flagName(a)
		if !ok {
			positional = append(positional, a)
			continue
		}
		takes, isCmd := cs[n]
		gtakes, isGlobal := gs[n]
		dst := &flags
		if !isCmd && isGlobal {
			dst, takes = &out, gtakes
		}
		*dst = append(*dst, a)
		if takes && !attached && i < len(args) {
			*dst = append(*dst, args[i])
			i++
		}
	}
	out = append(out, path...)
	out = append(out, flags...)
	if dashdash {
		out = append(out, "--")
	}
	return append(out, positional...)
}

// forgeArgs is reorderArgs for forge's own commands and flags.
func forgeArgs(args []string) []string { return reorderArgs(args, commands, globalFlags()) }

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

// resolveModel turns what the user typed for a model into a file: an
// existing path as it is, else an Ollama name (name:tag) or a Hugging
// Face cache name (org/name[:QUANT], org/name/FILE).
func resolveModel(name string) (string, error) {
	p, err := store.Default().Resolve(name)
	if err != nil {
		return "", fmt.Errorf("model %q: %w", name, err)
	}
	return p, nil
}

// modelFlagOrArg is a command's model: -m, or its one positional argument; an
// error if both or neither are given, or if there are other arguments.
func modelFlagOrArg(c *cli.Context, cmd string) (string, error) {
	m := c.String("model")
	args := c.Args().Slice()
	switch {
	case len(args) > 1:
		return "", usageErrorf("%s: one MODEL expected, got %q", cmd, args)
	case len(args) == 1 && m != "":
		return "", usageErrorf("%s: model given twice: -m %q and %q", cmd, m, args[0])
	case len(args) == 1:
		m = args[0]
	case m == "":
		return "", usageErrorf("%s: no model: give MODEL or -m MODEL (a path or a store name such as llama3.2:1b or org/name:Q4_K_M)", cmd)
	}
	return resolveModel(m)
}

// exactFloat is a float32 default as the float64 with the same shortest
// decimal (0.8, not 0.800000011920929), so that help prints it as typed
// and parsing it back to float32 gives the same value.
func exactFloat(x float32) float64 {
	f, _ := strconv.ParseFloat(strconv.FormatFloat(float64(x), 'g', -1, 32), 64)
	return f
}

// isReaderTerminal reports whether r is a terminal (stdin as a terminal
// is a person typing, not a prompt piped in).
func isReaderTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	return isTerminal(f)
}
