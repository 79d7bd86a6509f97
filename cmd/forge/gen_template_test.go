package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/pipeline/chat"
)

// TestFamilyTemplates: each family's Jinja text is recognised by
// pipeline/chat as that family.
func TestFamilyTemplates(t *testing.T) {
	for fam, src := range familyTemplates {
		tm, err := chat.Parse(src)
		if err != nil || tm.Family != fam {
			t.Errorf("%s: parsed as %+v, %v", fam, tm, err)
		}
	}
}

// TestGenChatTemplate: forge gen --chat-template stores a family's
// template, or a file's text as it is; an unreadable name is a usage
// error.
func TestGenChatTemplate(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "t.jinja")
	custom := "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
	if err := os.WriteFile(file, []byte(custom), 0o644); err != nil {
		t.Fatal(err)
	}
	for arg, want := range map[string]string{"llama3": familyTemplates[chat.Llama3], file: custom} {
		out := filepath.Join(dir, "m.gguf")
		var stdout, stderr bytes.Buffer
		if err := newApp(&stdout, &stderr).Run([]string{"forge", "gen", "--preset", "tiny", "-q", "q8_0", "--chat-template", arg, "-o", out, "--progress", "plain"}); err != nil {
			t.Fatal(err)
		}
		f, err := gguf.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := f.String("tokenizer.chat_template")
		f.Close()
		if got != want {
			t.Errorf("%s: stored %q, want %q", arg, got, want)
		}
	}
	var stdout, stderr bytes.Buffer
	err := newApp(&stdout, &stderr).Run([]string{"forge", "gen", "--preset", "tiny", "--chat-template", filepath.Join(dir, "missing"), "-o", filepath.Join(dir, "x.gguf")})
	if exitCode(err) != 2 {
		t.Errorf("a missing template file: %v (exit %d), want a usage error", err, exitCode(err))
	}
}

// TestStoriesChatFile: gguf/testdata/stories260K-chat.gguf is
// stories260K-Q8_0 with the ChatML template added, byte for byte what
// withChatTemplate writes (go test -run TestStoriesChatFile -update
// rewrites it).
func TestStoriesChatFile(t *testing.T) {
	var b bytes.Buffer
	if err := withChatTemplate(&b, testmodels.Path(t, "stories260K-Q8_0.gguf"), familyTemplates[chat.ChatML]); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(testmodels.Dir(), "stories260K-chat.gguf")
	if *update {
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, b.Bytes()) {
		t.Fatalf("%s differs from stories260K-Q8_0 with the ChatML template (%d vs %d bytes)", path, len(got), b.Len())
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	src, err := gguf.Open(testmodels.Path(t, "stories260K-Q8_0.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if len(f.Tensors) != len(src.Tensors) || len(f.Metadata) != len(src.Metadata)+1 {
		t.Errorf("%d tensors, %d keys; source %d, %d", len(f.Tensors), len(f.Metadata), len(src.Tensors), len(src.Metadata))
	}
	for i := range src.Tensors {
		a, _ := src.TensorData(&src.Tensors[i])
		c, _ := f.TensorData(&f.Tensors[i])
		if !bytes.Equal(a, c) || f.Tensors[i].Name != src.Tensors[i].Name {
			t.Errorf("tensor %s differs", src.Tensors[i].Name)
		}
	}
	tmpl, _ := f.String("tokenizer.chat_template")
	if tm, err := chat.Parse(tmpl); err != nil || tm.Family != chat.ChatML || !strings.Contains(tmpl, "add_generation_prompt") {
		t.Errorf("template %q: %+v %v", tmpl, tm, err)
	}
}
