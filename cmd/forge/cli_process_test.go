package main

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/creack/pty"

	"github.com/forge-llm/forge/gguf/testmodels"
)

// TestProcessPipedPrompt: as a process (main's path: the arguments
// rearranged, stdin a real pipe), a prompt piped on stdin is the prompt,
// with the model after the subcommand and -v after the flags.
func TestProcessPipedPrompt(t *testing.T) {
	m := testmodels.Path(t, "stories260K-Q4_K_M.gguf")
	var stdout, stderr bytes.Buffer
	cmd := forgeProcess("run", m, "-n", "64", "--temp", "0", "-t", "2", "-v", "--log-format", "json")
	cmd.Stdin = strings.NewReader("Once upon a time\n")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	if want := expectedText(t) + "\n"; stdout.String() != want {
		t.Errorf("stdout\n got %q\nwant %q", stdout.String(), want)
	}
	// -v after the subcommand took effect: debug records, as JSON.
	if !strings.Contains(stderr.String(), `"level":"DEBUG"`) {
		t.Errorf("stderr has no JSON debug record:\n%s", stderr.String())
	}
}

// TestProcessTerminalStdin: stdin that is a terminal is a person, not a
// prompt: with no -p, forge run does not read it. The line typed into the
// terminal (then end of file) would be the prompt if it were read; the
// prompt is the BOS token alone instead.
func TestProcessTerminalStdin(t *testing.T) {
	cmd := forgeProcess("run", testmodels.Path(t, "stories260K-Q4_K_M.gguf"), "-n", "4", "--temp", "0", "-t", "2", "--progress", "plain")
	tty, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 160})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tty.Write([]byte("Once upon a time\n\x04")); err != nil {
		t.Fatal(err)
	}
	var screen bytes.Buffer
	io.Copy(&screen, tty) // until the child exits (EIO on Linux)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("forge run: %v\n%s", err, screen.String())
	}
	tty.Close()
	if !strings.Contains(screen.String(), "prompt 1 tok") {
		t.Errorf("want a prompt of BOS alone (stdin not read):\n%s", screen.String())
	}
}
