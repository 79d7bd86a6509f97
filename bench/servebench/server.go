package servebench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Server is a `forge serve` process the benchmark started.
type Server struct {
	URL  string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has been waited for
	err  error         // Wait's error, once done is closed
	log  *tailWriter
}

// StartServer runs argv (the forge binary and "serve" with its flags,
// which must include --addr 127.0.0.1:0) with env added to this process's
// environment, reads the address it listens on from its log, then waits
// until GET /health answers and every model in models is resident through
// GET /v1/models (with allowEvicted, evicted models count too, but one
// must be resident: a budget that holds one of them). ctx bounds the wait
// (the process is stopped if it ends first); Stop ends the process.
func StartServer(ctx context.Context, hc *http.Client, argv, env []string, models []string, allowEvicted bool) (*Server, error) {
	if len(argv) == 0 {
		return nil, errors.New("servebench: no server command")
	}
	s := &Server{done: make(chan struct{}), log: &tailWriter{addr: make(chan string, 1)}}
	s.cmd = exec.Command(argv[0], argv[1:]...)
	s.cmd.Env = append(s.cmd.Environ(), env...)
	s.cmd.Stderr = s.log
	s.cmd.Stdout = s.log
	s.cmd.WaitDelay = 5 * time.Second // output pipes held open by a grandchild
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("servebench: starting %s: %w", argv[0], err)
	}
	go func() {
		s.err = s.cmd.Wait()
		close(s.done)
	}()
	fail := func(err error) (*Server, error) {
		s.Stop()
		return nil, fmt.Errorf("servebench: forge serve: %w\n%s", err, s.log.tail())
	}
	select {
	case addr := <-s.log.addr:
		s.URL = "http://" + addr
	case <-s.done:
		return fail(fmt.Errorf("exited before listening: %v", s.err))
	case <-ctx.Done():
		return fail(ctx.Err())
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		last = s.ready(ctx, hc, models, allowEvicted)
		if last == nil {
			return s, nil
		}
		var perm permanent
		if errors.As(last, &perm) {
			return fail(last)
		}
		select {
		case <-tick.C:
		case <-s.done:
			return fail(fmt.Errorf("exited while loading: %v (last check: %v)", s.err, last))
		case <-ctx.Done():
			return fail(fmt.Errorf("%w (last check: %v)", ctx.Err(), last))
		}
	}
}

// permanent marks a readiness error that waiting will not cure.
type permanent struct{ error }

func (s *Server) ready(ctx context.Context, hc *http.Client, models []string, allowEvicted bool) error {
	if e := s.log.loadError(); e != "" {
		return permanent{fmt.Errorf("a model failed to load: %s", e)}
	}
	if _, err := getJSON(ctx, hc, s.URL+"/health", nil); err != nil {
		return err
	}
	var list struct {
		Data []struct {
			ID    string `json:"id"`
			Forge struct {
				State string `json:"state"`
				Err   string `json:"error"`
			} `json:"forge"`
		} `json:"data"`
	}
	if _, err := getJSON(ctx, hc, s.URL+"/v1/models", &list); err != nil {
		return err
	}
	state := map[string]string{}
	for _, m := range list.Data {
		state[m.ID] = m.Forge.State
		if m.Forge.State == "failed" {
			return permanent{fmt.Errorf("model %s failed to load: %s", m.ID, m.Forge.Err)}
		}
	}
	resident := 0
	for _, id := range models {
		switch st := state[id]; {
		case st == "resident":
			resident++
		case st == "evicted" && allowEvicted:
		default:
			return fmt.Errorf("model %s is %q", id, st)
		}
	}
	if len(models) > 0 && resident == 0 {
		return errors.New("no model resident yet")
	}
	return nil
}

// Stop ends the server as a user would (SIGTERM, so it shuts down
// cleanly), waits for it, and kills it if it has not ended within 30 s.
func (s *Server) Stop() error {
	select {
	case <-s.done:
		return nil
	default:
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
		return fmt.Errorf("servebench: forge serve did not stop within 30 s of SIGTERM; killed")
	}
	var ee *exec.ExitError
	if s.err != nil && !errors.As(s.err, &ee) {
		return fmt.Errorf("servebench: forge serve: %w", s.err)
	}
	if ee != nil && !ee.Success() {
		return fmt.Errorf("servebench: forge serve ended with %v\n%s", ee, s.log.tail())
	}
	return nil
}

// Log is the last lines the server wrote.
func (s *Server) Log() string { return s.log.tail() }

// tailWriter keeps the last lines of the server's output and picks the
// listening address out of its start-up log line
// (`msg="forge serve listening" addr=127.0.0.1:PORT`).
type tailWriter struct {
	mu    sync.Mutex
	part  bytes.Buffer
	lines []string
	addr  chan string
	found bool
	// loadErr is the server's log line saying a -m model failed to load:
	// forge serve logs it, but its API leaves such a model "unloaded",
	// which waiting would not change.
	loadErr string
}

const tailLines = 30

func (w *tailWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.part.Write(p)
	for {
		line, err := w.part.ReadString('\n')
		if err != nil { // no newline yet: keep the partial line
			rest := line
			w.part.Reset()
			w.part.WriteString(rest)
			break
		}
		line = strings.TrimRight(line, "\n")
		w.lines = append(w.lines, line)
		if len(w.lines) > tailLines {
			w.lines = w.lines[len(w.lines)-tailLines:]
		}
		if w.loadErr == "" && strings.Contains(line, "level=ERROR") && strings.Contains(line, `msg="loading model"`) {
			w.loadErr = line
		}
		if !w.found && strings.Contains(line, "forge serve listening") {
			if _, rest, ok := strings.Cut(line, " addr="); ok {
				if i := strings.IndexByte(rest, ' '); i >= 0 {
					rest = rest[:i]
				}
				w.found = true
				w.addr <- rest
			}
		}
	}
	return len(p), nil
}

func (w *tailWriter) loadError() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.loadErr
}

func (w *tailWriter) tail() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.lines, "\n")
}

// WaitLoading waits while a running server's GET /health answers 503,
// which llama-server does until its model is loaded. Any other answer,
// or none (a server that is down is measured as failing), ends the wait;
// only ctx ending is an error.
func WaitLoading(ctx context.Context, hc *http.Client, base string) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		status, _ := getJSON(ctx, hc, base+"/health", nil)
		if status != http.StatusServiceUnavailable {
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("servebench: %s/health still says 503 (loading): %w", base, ctx.Err())
		}
	}
}
