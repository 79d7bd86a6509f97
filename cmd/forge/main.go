// Command forge runs GGUF language models on GPUs (CUDA, ROCm/HIP) and on the
// CPU. Each subcommand lives in its own file and registers itself in init,
// so the commands stay independent of each other.
package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/urfave/cli/v2"
)

// commands is filled by the init functions of the files beside this one.
var commands []*cli.Command

func newApp(stdout, stderr io.Writer) *cli.App {
	return &cli.App{
		Name:      "forge",
		Usage:     "run GGUF language models, first token first",
		Commands:  commands,
		Writer:    stdout,
		ErrWriter: stderr,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "verbose", Aliases: []string{"v"}, Usage: "debug logs on stderr"},
		},
		Before: func(c *cli.Context) error {
			level := slog.LevelInfo
			if c.Bool("verbose") {
				level = slog.LevelDebug
			}
			slog.SetDefault(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})))
			return nil
		},
	}
}

func main() {
	if err := newApp(os.Stdout, os.Stderr).Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "forge:", err)
		os.Exit(1)
	}
}
