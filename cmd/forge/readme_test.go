package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// readmeBlock is one ```sh block of the README.
type readmeBlock struct {
	line   int    // of the opening fence
	script string // the lines between the fences
	skip   string // the reason its marker gives; "" runs it
}

// readmeSkip is the marker that keeps a block from running, on the line
// just before its fence: <!-- readme-test: skip REASON: why -->.
var readmeSkip = regexp.MustCompile(`^<!-- readme-test: skip ([a-z]+): .+ -->$`)

// readmeSkipReasons are the reasons a block may not run here: it needs a
// GPU, the network, models a fresh machine's stores do not hold, writes
// gigabytes, needs another server, or runs the whole suite (this test
// included).
var readmeSkipReasons = map[string]bool{"gpu": true, "network": true, "store": true, "large": true, "peer": true, "suite": true}

// readmeBlocks extracts the README's sh blocks with their markers.
func readmeBlocks(t *testing.T, text string) []readmeBlock {
	t.Helper()
	var out []readmeBlock
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		fence := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(fence, "```") {
			continue
		}
		lang := strings.TrimPrefix(fence, "```")
		j := i + 1
		for j < len(lines) && strings.TrimSpace(lines[j]) != "```" {
			j++
		}
		if j == len(lines) {
			t.Fatalf("README line %d: the block never ends", i+1)
		}
		if lang == "sh" {
			b := readmeBlock{line: i + 1, script: strings.Join(lines[i+1:j], "\n") + "\n"}
			if i > 0 {
				if m := readmeSkip.FindStringSubmatch(lines[i-1]); m != nil {
					b.skip = m[1]
				} else if strings.Contains(lines[i-1], "readme-test") {
					t.Errorf("README line %d: a marker that does not parse: %q", i, lines[i-1])
				}
			}
			out = append(out, b)
		}
		i = j
	}
	return out
}

// cloneRepo copies the files git would put in a fresh clone of the
// working tree (tracked and untracked, not ignored: no bin/, no build
// outputs) into a temporary folder.
func cloneRepo(t *testing.T, root string) string {
	t.Helper()
	out, err := exec.Command("git", "-C", root, "ls-files", "-z", "-co", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files (the README test copies the working tree as a clone would hold it): %v", err)
	}
	dst := t.TempDir()
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		src := filepath.Join(root, name)
		fi, err := os.Lstat(src)
		if err != nil || !fi.Mode().IsRegular() {
			continue // deleted in the working tree, or not a file
		}
		to := filepath.Join(dst, name)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			t.Fatal(err)
		}
		in, err := os.Open(src)
		if err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fi.Mode().Perm())
		if err == nil {
			_, err = io.Copy(f, in)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		in.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// TestREADME runs every sh block of the README as written, in order, in a
// copy of the repository, each with bash -e -o pipefail and stdin empty
// (forge chat then reads no turn and quits). Blocks marked with a reason
// are listed, not run; a marker with an unknown reason fails.
func TestREADME(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the README test builds forge and runs every example (minutes)")
	}
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatalf("bash: %v", err)
	}
	for _, tool := range []string{"make", "curl", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the README's examples use %s: %v", tool, err)
		}
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := readmeBlocks(t, string(text))
	run := 0
	for _, b := range blocks {
		if b.skip == "" {
			run++
		} else if !readmeSkipReasons[b.skip] {
			t.Errorf("README line %d: skip reason %q is not one of gpu, network, store, large, peer, suite", b.line, b.skip)
		}
	}
	if run < 8 {
		t.Fatalf("only %d runnable sh blocks in the README", run)
	}
	// The serve example listens on forge's default address.
	if ln, err := net.Listen("tcp", "127.0.0.1:8080"); err != nil {
		t.Fatalf("127.0.0.1:8080, which the README's serve example uses, is taken: %v", err)
	} else {
		ln.Close()
	}

	dir := cloneRepo(t, root)
	home := t.TempDir()
	env := []string{"HOME=" + home, "OLLAMA_MODELS=" + filepath.Join(home, "ollama"), "HF_HUB_CACHE=" + filepath.Join(home, "hf")}
	// The Go caches stay the user's: a fresh build of every package would
	// take minutes.
	for _, k := range []string{"GOCACHE", "GOMODCACHE", "GOPATH"} {
		v, err := exec.Command("go", "env", k).Output()
		if err != nil {
			t.Fatal(err)
		}
		env = append(env, k+"="+strings.TrimSpace(string(v)))
	}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "HOME", "OLLAMA_MODELS", "HF_HUB_CACHE", "HF_HOME", "FORGE_API_KEY", asMainEnv:
		default:
			env = append(env, kv)
		}
	}
	for _, b := range blocks {
		if b.skip != "" {
			t.Logf("README line %d: not run (%s):\n%s", b.line, b.skip, b.script)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		cmd := exec.CommandContext(ctx, "bash", "-e", "-o", "pipefail", "-c", b.script)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("README line %d: %v\n--- script\n%s--- output\n%s", b.line, err, b.script, out)
		}
		// curl -s exits 0 on an HTTP error: an answer's error object
		// is the failure.
		if strings.Contains(string(out), `{"error":`) {
			t.Fatalf("README line %d: an API answered an error\n--- script\n%s--- output\n%s", b.line, b.script, out)
		}
		t.Logf("README line %d: ran, %d lines of output", b.line, countLines(out))
	}
}

func countLines(b []byte) int {
	n := 0
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		n++
	}
	return n
}

// TestREADMEBlocks: the extraction finds markers and fences as written.
func TestREADMEBlocks(t *testing.T) {
	md := "text\n<!-- readme-test: skip gpu: needs a GPU -->\n```sh\nbin/forge run --device gpu\n```\n```text\nsynopsis\n```\n```sh\necho a\necho b\n```\n"
	bs := readmeBlocks(t, md)
	if len(bs) != 2 || bs[0].skip != "gpu" || bs[0].line != 3 || bs[1].skip != "" || bs[1].script != "echo a\necho b\n" {
		t.Errorf("blocks %+v", bs)
	}
}
