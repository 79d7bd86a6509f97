// Command forge runs GGUF language models on GPUs (CUDA, ROCm/HIP) and on the
// CPU. Each subcommand lives in its own file and registers itself in init,
// so the commands stay independent of each other.
//
// Exit status: 0 on success, 1 on a failure, 2 on a usage error (a flag
// that does not parse or is out of range), 128+n when signal n (SIGINT
// 130, SIGTERM 143) interrupted the command.
package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"

	"github.com/urfave/cli/v2"
)

// commands is filled by the init functions of the files beside this one.
var commands []*cli.Command

// exitError is an error with an exit status other than 1. It deliberately
// does not implement cli.ExitCoder: urfave/cli would call os.Exit itself,
// inside tests too.
type exitError struct {
	code  int
	err   error
	quiet bool // already reported to the user
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usageErrorf is a mistake in the command line: exit status 2.
func usageErrorf(format string, a ...any) error {
	return &exitError{code: 2, err: fmt.Errorf(format, a...)}
}

// exitCode is the process's exit status for an error returned by the app.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := errors.AsType[*exitError](err); ok {
		return ee.code
	}
	// urfave/cli's missing-flag error has no exported type.
	if strings.HasPrefix(err.Error(), "Required flag") {
		return 2
	}
	return 1
}

// onUsageError reports a flag that does not parse: the one-line error,
// then the command's usage, both on stderr (stdout is for output), and
// exit status 2.
func onUsageError(c *cli.Context, err error, _ bool) error {
	w := c.App.ErrWriter
	fmt.Fprintf(w, "forge: %v\n\n", err)
	if c.Command != nil && c.Command.Name != "" {
		cli.HelpPrinter(w, cli.CommandHelpTemplate, c.Command)
	} else {
		cli.HelpPrinter(w, cli.AppHelpTemplate, c.App)
	}
	return &exitError{code: 2, err: err, quiet: true}
}

// setUsageHandlers installs onUsageError on every command once (the
// commands are shared by every app newApp makes).
var setUsageHandlers = sync.OnceFunc(func() {
	var walk func(cs []*cli.Command)
	walk = func(cs []*cli.Command) {
		for _, c := range cs {
			c.OnUsageError = onUsageError
			walk(c.Subcommands)
		}
	}
	walk(commands)
})

func newApp(stdout, stderr io.Writer) *cli.App {
	setUsageHandlers()
	stopProfile := func() error { return nil } // --cpu-profile's, set by Before
	return &cli.App{
		Name:         "forge",
		Usage:        "run GGUF language models, first token first",
		Commands:     commands,
		Writer:       stdout,
		ErrWriter:    stderr,
		OnUsageError: onUsageError,
		Version:      version(),
		Flags:        globalFlags(),
		Before: func(c *cli.Context) error {
			l, err := newLogger(stderr, c.String("log-level"), c.String("log-format"), c.Bool("verbose"))
			if err != nil {
				return err
			}
			slog.SetDefault(l)
			stop, err := startCPUProfile(c.String("cpu-profile"))
			if err != nil {
				return err
			}
			stopProfile = stop
			return nil
		},
		After: func(*cli.Context) error { return stopProfile() },
	}
}

// report prints err (unless it was already printed) and returns the exit
// status.
func report(w io.Writer, err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := errors.AsType[*exitError](err); !ok || !ee.quiet {
		fmt.Fprintln(w, "forge:", err)
	}
	return exitCode(err)
}

func main() {
	os.Exit(report(os.Stderr, newApp(os.Stdout, os.Stderr).Run(forgeArgs(os.Args))))
}
