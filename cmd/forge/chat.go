package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/pipeline"
	"github.com/forge-llm/forge/pipeline/chat"
	"github.com/forge-llm/forge/pipeline/sample"
)

// forge chat (and forge run -i): a conversation on a terminal. Each line
// typed is a user turn; the whole history, rendered with the chat
// template, is the prompt of the reply, which streams as it is
// generated. Ctrl-C stops the reply being written (the conversation goes
// on, with the part already written); Ctrl-D, /exit or /bye quits; /clear
// forgets the history (the system message stays).

// chatFlags are the flags of forge chat, which forge run shares for -i.
func chatFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "system", Usage: "system message `TEXT` at the start of the conversation"},
		&cli.StringFlag{Name: "chat-template", Usage: "chat template: `NAME` (chatml, llama2, llama3, mistral) or a FILE holding one (default: the model's; ChatML, with a warning, for a model without one)"},
	}
}

func init() {
	d := sample.Defaults()
	flags := []cli.Flag{
		&cli.StringFlag{Name: "model", Aliases: []string{"m"}, Usage: "GGUF model file or store name (or give it as MODEL)"},
		&cli.IntFlag{Name: "max-tokens", Aliases: []string{"n"}, Value: 512, Usage: "most tokens of one reply (0: until end of text or a full context)"},
		&cli.Float64Flag{Name: "temp", Value: exactFloat(d.Temp), Usage: "temperature; 0 is greedy"},
		&cli.IntFlag{Name: "top-k", Value: d.TopK, Usage: "keep the K most likely tokens (0: off)"},
		&cli.Float64Flag{Name: "top-p", Value: exactFloat(d.TopP), Usage: "nucleus sampling threshold (1: off)"},
		&cli.Float64Flag{Name: "min-p", Value: exactFloat(d.MinP), Usage: "drop tokens below min-p × the most likely (0: off)"},
		&cli.Float64Flag{Name: "repeat-penalty", Value: exactFloat(d.RepeatPenalty), Usage: "penalty on recently seen tokens (1: off)"},
		&cli.IntFlag{Name: "repeat-last-n", Value: d.RepeatLastN, Usage: "how many recent tokens the penalty looks at"},
		&cli.Int64Flag{Name: "seed", Value: -1, Usage: "random seed (-1: random)"},
		&cli.IntFlag{Name: "ctx", Aliases: []string{"c", "ctx-size"}, Usage: "context length (0: the model's, at most 4096); the oldest turns are dropped when the conversation outgrows it"},
		&cli.StringFlag{Name: "device", Value: "auto", Usage: "auto, cpu, gpu or gpu:N"},
		&cli.IntFlag{Name: "threads", Aliases: []string{"t"}, Usage: "CPU threads (0: all cores)"},
		&cli.DurationFlag{Name: "token-delay", Hidden: true, Usage: "wait this long after each generated token"},
	}
	commands = append(commands, &cli.Command{
		Name:      "chat",
		Usage:     "talk with a model on the terminal",
		ArgsUsage: "[MODEL]",
		Description: "An interactive conversation: each line you type is a turn, the reply streams as it is " +
			"generated, rendered with the model's chat template (--chat-template to choose one; a model " +
			"without one gets ChatML, with a warning). Ctrl-C stops the reply being written; Ctrl-D, /exit " +
			"or /bye quits; /clear forgets the conversation (the --system message stays). With stdin not a " +
			"terminal, each line read is a turn and only the replies are printed.",
		Flags:  append(flags, chatFlags()...),
		Action: chatCmd,
	})
}

func chatCmd(c *cli.Context) error {
	ctx := c.Context
	if ctx == nil {
		ctx = context.Background()
	}
	return runChat(ctx, c, "chat")
}

// runChat is forge chat, and forge run -i (cmd "run").
func runChat(ctx context.Context, c *cli.Context, cmd string) error {
	stdout, stderr := c.App.Writer, c.App.ErrWriter
	device := c.String("device")
	if err := checkDevice(device); err != nil {
		return err
	}
	if err := checkInts(c,
		intRange{"ctx", 0, gguf.MaxContext, "0: the model's, at most 4096"},
		intRange{"threads", 0, maxThreads, "0: all cores"},
	); err != nil {
		return err
	}
	if s := c.Int64("seed"); s < -1 {
		return usageErrorf("--seed %d: must be ≥ -1 (-1: random)", s)
	}
	gopts := pipeline.GenerateOptions{MaxTokens: c.Int("max-tokens"), Sampling: samplingFlags(c)}
	if err := checkGenerate(gopts); err != nil {
		return err
	}
	var tmpl *chat.Template
	if arg := c.String("chat-template"); arg != "" {
		t, err := loadChatTemplate(arg)
		if err != nil {
			return &exitError{code: 2, err: err}
		}
		tmpl = t
	}
	path, err := modelFlagOrArg(c, cmd)
	if err != nil {
		return err
	}
	in := c.App.Reader
	if in == nil {
		in = strings.NewReader("")
	}
	m, err := pipeline.Open(ctx, path, pipeline.Options{Device: device, Threads: c.Int("threads"), Ctx: c.Int("ctx")})
	if err != nil {
		return err
	}
	defer m.Close()
	if tmpl == nil {
		tmpl = modelTemplate(m, stderr)
	}
	s := &chatSession{
		m: m, tmpl: tmpl, gopts: gopts, out: stdout, errw: stderr,
		in: bufio.NewReader(in), interactive: isReaderTerminal(in),
		ctxLen: m.Config().Ctx, delay: c.Duration("token-delay"),
	}
	if n := c.Int("ctx"); n > 0 {
		s.ctxLen = n
	} else if s.ctxLen <= 0 || s.ctxLen > 4096 {
		s.ctxLen = 4096
	}
	if sys := c.String("system"); sys != "" {
		s.system = &chat.Message{Role: "system", Content: sys}
	}
	return s.run(ctx)
}

// modelTemplate is the model's own template, or ChatML with a warning
// when it has none pipeline/chat can render (as llama-server does).
func modelTemplate(m *pipeline.Model, warn io.Writer) *chat.Template {
	t, err := chat.Parse(m.ChatTemplate())
	if err == nil {
		return t
	}
	fmt.Fprintf(warn, "forge: warning: %v: using ChatML (see --chat-template)\n", err)
	return defaultTemplate
}

// chatSession is one conversation.
type chatSession struct {
	m           *pipeline.Model
	tmpl        *chat.Template
	gopts       pipeline.GenerateOptions
	system      *chat.Message
	history     []chat.Message // user and assistant turns
	in          *bufio.Reader
	out, errw   io.Writer
	interactive bool
	ctxLen      int
	delay       time.Duration // after each token (tests: a reply slow enough to interrupt)

	mu     sync.Mutex // guards cancel and the writes of the signal handler
	cancel context.CancelFunc
}

const chatHelp = "Type a message and Enter. Ctrl-C stops a reply; /clear forgets the conversation; Ctrl-D, /exit or /bye quits."

// run reads turns until the end of input or /exit.
func (s *chatSession) run(ctx context.Context) error {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-sigs:
				s.interrupt()
			case <-stop:
				return
			}
		}
	})
	defer func() {
		signal.Stop(sigs)
		close(stop)
		wg.Wait()
	}()

	if s.interactive {
		fmt.Fprintln(s.out, chatHelp)
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		s.prompt()
		line, err := s.in.ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("chat: reading input: %w", err)
		}
		if errors.Is(err, io.EOF) && line == "" {
			if s.interactive {
				fmt.Fprintln(s.out)
			}
			return nil
		}
		text := strings.TrimSpace(line)
		switch text {
		case "":
			continue
		case "/exit", "/bye", "/quit":
			return nil
		case "/clear":
			s.history = nil
			if s.interactive {
				fmt.Fprintln(s.out, "(conversation cleared)")
			}
			continue
		case "/help", "/?":
			fmt.Fprintln(s.out, chatHelp)
			continue
		}
		if err := s.turn(ctx, text); err != nil {
			return err
		}
	}
}

// prompt writes the input prompt on a terminal.
func (s *chatSession) prompt() {
	if !s.interactive {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprint(s.out, ">>> ")
}

// interrupt is Ctrl-C: it stops the reply being written, or, at the
// prompt, says how to quit and prompts again.
func (s *chatSession) interrupt() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancel != nil {
		s.cancel()
		return
	}
	if s.interactive {
		fmt.Fprint(s.out, "\n(Ctrl-D or /exit quits)\n>>> ")
	}
}

// messages is the conversation as the template renders it.
func (s *chatSession) messages() []chat.Message {
	var msgs []chat.Message
	if s.system != nil {
		msgs = append(msgs, *s.system)
	}
	return append(msgs, s.history...)
}

// turn answers one user message: the history and the message are
// rendered and tokenized (the oldest turns dropped while the prompt
// leaves no room for a reply), and the reply streams out.
func (s *chatSession) turn(ctx context.Context, text string) error {
	s.history = append(s.history, chat.Message{Role: "user", Content: text})
	var ids []int32
	for {
		var err error
		ids, err = s.m.ChatPrompt(ctx, s.messages(), s.tmpl)
		if err != nil {
			s.history = s.history[:len(s.history)-1]
			return fmt.Errorf("chat: %w", err)
		}
		if len(ids) < s.ctxLen || len(s.history) == 1 {
			break
		}
		// Drop the oldest exchange (a user turn and its reply).
		n := min(2, len(s.history)-1)
		s.history = s.history[n:]
		fmt.Fprintf(s.errw, "forge: the conversation outgrew the %d-token context: the oldest turn was dropped\n", s.ctxLen)
	}
	if len(ids) >= s.ctxLen {
		s.history = s.history[:len(s.history)-1]
		fmt.Fprintf(s.errw, "forge: the message is %d tokens with the template; the context holds %d\n", len(ids), s.ctxLen)
		return nil
	}

	rctx, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	s.cancel = cancel
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.cancel = nil
		s.mu.Unlock()
		cancel()
	}()
	o := s.gopts
	o.PromptIDs = ids
	var printed strings.Builder
	o.OnToken = func(t pipeline.Token) error {
		printed.WriteString(t.Text)
		s.mu.Lock()
		_, err := io.WriteString(s.out, t.Text)
		s.mu.Unlock()
		if err != nil {
			return err
		}
		if s.delay > 0 {
			t := time.NewTimer(s.delay)
			defer t.Stop()
			select {
			case <-t.C:
			case <-rctx.Done():
			}
		}
		return nil
	}
	res, err := s.m.Generate(rctx, "", o)
	interrupted := errors.Is(err, context.Canceled) && ctx.Err() == nil
	if err != nil && !interrupted {
		return fmt.Errorf("chat: %w", err)
	}
	reply := res.Text
	if rest, ok := strings.CutPrefix(reply, printed.String()); ok {
		io.WriteString(s.out, rest)
	}
	if interrupted {
		reply = printed.String()
		io.WriteString(s.out, " [stopped]")
	}
	io.WriteString(s.out, "\n")
	s.history = append(s.history, chat.Message{Role: "assistant", Content: strings.TrimSpace(reply)})
	return nil
}

// chatTurn is forge run's prompt as a one-turn conversation, for run with
// --system or --chat-template: the system message and the prompt as a
// user turn, rendered with the template and tokenized.
func chatTurn(ctx context.Context, c *cli.Context, m *pipeline.Model, prompt string) ([]int32, error) {
	var tmpl *chat.Template
	if arg := c.String("chat-template"); arg != "" {
		t, err := loadChatTemplate(arg)
		if err != nil {
			return nil, &exitError{code: 2, err: err}
		}
		tmpl = t
	} else {
		tmpl = modelTemplate(m, c.App.ErrWriter)
	}
	var msgs []chat.Message
	if sys := c.String("system"); sys != "" {
		msgs = append(msgs, chat.Message{Role: "system", Content: sys})
	}
	msgs = append(msgs, chat.Message{Role: "user", Content: prompt})
	ids, err := m.ChatPrompt(ctx, msgs, tmpl)
	if err != nil {
		return nil, fmt.Errorf("run: %w", err)
	}
	return ids, nil
}
