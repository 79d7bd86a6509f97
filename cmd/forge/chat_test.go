package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/forge-llm/forge/gguf/testmodels"
)

// chatReplies runs forge chat in-process with stdin not a terminal: each
// line a turn, the replies one per line on stdout.
func chatReplies(t *testing.T, input string, extra ...string) (string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	app := newApp(&stdout, &stderr)
	app.Reader = strings.NewReader(input)
	args := append([]string{"forge", "chat", testmodels.Path(t, "stories260K-chat.gguf"), "--temp", "0", "-n", "8", "--device", "cpu", "-t", "1"}, extra...)
	if err := app.Run(forgeArgs(args)); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, stderr.String())
	}
	return stdout.String(), stderr.String()
}

// TestChatPiped: with stdin not a terminal, each line is a turn and the
// replies come one per line; the history changes later replies, /clear
// forgets it, --system and the template are in the prompt; a model
// without a template gets ChatML with a warning.
func TestChatPiped(t *testing.T) {
	alone, _ := chatReplies(t, "Lily found a ball.\n")
	tim, _ := chatReplies(t, "Tim had a red car.\n")
	if !strings.HasSuffix(alone, "\n") || len(strings.TrimSpace(alone)) == 0 || len(strings.TrimSpace(tim)) == 0 {
		t.Fatalf("one turn: %q, %q", alone, tim)
	}
	two, stderr := chatReplies(t, "Tim had a red car.\nLily found a ball.\n")
	if !strings.HasPrefix(two, tim) || two == tim+alone {
		t.Errorf("two turns %q: want the first reply %q, then one that depends on it (not %q)", two, tim, alone)
	}
	if strings.Contains(stderr, "warning") {
		t.Errorf("a model with a template warned: %s", stderr)
	}
	cleared, _ := chatReplies(t, "Tim had a red car.\n/clear\nLily found a ball.\n")
	if cleared != tim+alone {
		t.Errorf("after /clear: %q, want %q then the reply alone %q", cleared, tim, alone)
	}
	sys, _ := chatReplies(t, "Lily found a ball.\n", "--system", "Once upon a time, there was a big cat named Tom.")
	if sys == alone {
		t.Errorf("--system changed nothing: %q", sys)
	}
	// The same template named on the command line gives the same reply.
	named, _ := chatReplies(t, "Lily found a ball.\n", "--chat-template", "chatml")
	if named != alone {
		t.Errorf("--chat-template chatml: %q, the file's ChatML: %q", named, alone)
	}
	// stories260K-Q8_0 is the same model without a template: ChatML and a
	// warning, the same reply.
	var stdout, stderr2 bytes.Buffer
	app := newApp(&stdout, &stderr2)
	app.Reader = strings.NewReader("Lily found a ball.\n")
	if err := app.Run([]string{"forge", "chat", "-m", testmodels.Path(t, "stories260K-Q8_0.gguf"), "--temp", "0", "-n", "8", "--device", "cpu"}); err != nil {
		t.Fatal(err)
	}
	if stdout.String() != alone || !strings.Contains(stderr2.String(), "warning") || !strings.Contains(stderr2.String(), "ChatML") {
		t.Errorf("no template: %q, stderr %q", stdout.String(), stderr2.String())
	}
	// forge run -i is the same conversation.
	stdout.Reset()
	app = newApp(&stdout, &stderr2)
	app.Reader = strings.NewReader("Lily found a ball.\n")
	if err := app.Run([]string{"forge", "run", "-i", "-m", testmodels.Path(t, "stories260K-chat.gguf"), "--temp", "0", "-n", "8", "--device", "cpu"}); err != nil {
		t.Fatal(err)
	}
	if stdout.String() != alone {
		t.Errorf("run -i: %q, chat %q", stdout.String(), alone)
	}
	// forge run with --chat-template (or --system) sends the prompt as a
	// user turn: the reply a conversation gives.
	stdout.Reset()
	app = newApp(&stdout, &stderr2)
	if err := app.Run([]string{"forge", "run", "-m", testmodels.Path(t, "stories260K-Q8_0.gguf"), "-p", "Lily found a ball.", "--chat-template", "chatml", "--temp", "0", "-n", "8", "--device", "cpu"}); err != nil {
		t.Fatal(err)
	}
	if stdout.String() != alone {
		t.Errorf("run --chat-template chatml: %q, chat %q", stdout.String(), alone)
	}
}

// TestChatUsage: a bad template or flag is a usage error.
func TestChatUsage(t *testing.T) {
	for _, args := range [][]string{
		{"chat", testmodels.Path(t, "stories260K-chat.gguf"), "--chat-template", "/nonexistent"},
		{"chat", testmodels.Path(t, "stories260K-chat.gguf"), "--temp", "-1"},
		{"chat"},
	} {
		var stdout, stderr bytes.Buffer
		app := newApp(&stdout, &stderr)
		app.Reader = strings.NewReader("")
		if code := exitCode(app.Run(forgeArgs(append([]string{"forge"}, args...)))); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
}

// screen collects what a pseudo-terminal shows.
type screen struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *screen) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *screen) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.ReplaceAll(s.buf.String(), "\r\n", "\n")
}

// waitFor waits until the screen, from byte from on, contains want, and
// returns the index just after it. The deadline only keeps a broken
// chat from hanging the test.
func (s *screen) waitFor(t *testing.T, from int, want string) int {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out := s.String()
		if from <= len(out) {
			if i := strings.Index(out[from:], want); i >= 0 {
				return from + i + len(want)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q never came after byte %d; the screen:\n%s", want, from, out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestChatTerminal runs forge chat (this test binary acting as forge) in
// a pseudo-terminal: type a message, watch the reply stream, stop it with
// Ctrl-C mid-reply, /clear, type again, and quit with Ctrl-D.
func TestChatTerminal(t *testing.T) {
	model := testmodels.Path(t, "stories260K-chat.gguf")
	// The reply a fresh conversation gives to the second message, for
	// comparison after /clear.
	want, _ := chatReplies(t, "Lily found a ball.\n")
	want = strings.TrimSuffix(want, "\n")

	cmd := exec.Command(os.Args[0], "chat", model, "--temp", "0", "-n", "8", "--device", "cpu", "-t", "1", "--token-delay", "300ms")
	cmd.Env = append(os.Environ(), asMainEnv+"=1")
	tty, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 200})
	if err != nil {
		t.Fatal(err)
	}
	defer tty.Close()
	var scr screen
	copied := make(chan struct{})
	go func() { io.Copy(&scr, tty); close(copied) }() // until the child exits (EIO)

	at := scr.waitFor(t, 0, "quits.\n>>> ")
	// A long reply, slow enough to interrupt: the first piece of text
	// shows it streams, then Ctrl-C stops it and the prompt comes back.
	cmd2 := "Tell me a long story about a dog.\n"
	io.WriteString(tty, cmd2)
	at = scr.waitFor(t, at, "dog.\n") // the terminal's echo
	start := at
	for {
		out := scr.String()
		if len(strings.TrimSpace(out[start:])) >= 2 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	tty.Write([]byte{3}) // Ctrl-C
	at = scr.waitFor(t, at, " [stopped]\n>>> ")
	stopped := strings.TrimSuffix(strings.TrimSuffix(scr.String()[start:at], " [stopped]\n>>> "), "^C") // the terminal echoes ^C
	if stopped == "" {
		t.Errorf("no text before the stop")
	}

	io.WriteString(tty, "/clear\n")
	at = scr.waitFor(t, at, "(conversation cleared)\n>>> ")
	io.WriteString(tty, "Lily found a ball.\n")
	at = scr.waitFor(t, at, "ball.\n")
	reply0 := at
	at = scr.waitFor(t, at, "\n>>> ")
	if got := scr.String()[reply0 : at-len("\n>>> ")]; got != want {
		t.Errorf("after /clear the reply is %q; a fresh conversation's: %q", got, want)
	}
	tty.Write([]byte{4}) // Ctrl-D at an empty prompt
	<-copied
	if err := cmd.Wait(); err != nil {
		t.Fatalf("forge chat after Ctrl-D: %v\n%s", err, scr.String())
	}
	t.Logf("stopped reply %q; screen:\n%s", stopped, scr.String())
}
