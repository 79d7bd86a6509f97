package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/pipeline/chat"
)

// familyTemplates are Jinja texts, written for forge, of the chat formats
// pipeline/chat renders: what `forge gen --chat-template NAME` stores in a
// model's tokenizer.chat_template. Each carries the markers chat.Parse
// recognises its family by, and renders what that family's Go renderer
// writes.
var familyTemplates = map[chat.Family]string{
	chat.ChatML: "{% for message in messages %}" +
		"{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}" +
		"{% endfor %}" +
		"{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
	chat.Llama3: "{{ bos_token }}{% for message in messages %}" +
		"{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}" +
		"{% endfor %}" +
		"{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}",
	chat.Llama2: "{% if messages[0]['role'] == 'system' %}" +
		"{% set system = '<<SYS>>\\n' + messages[0]['content'] + '\\n<</SYS>>\\n\\n' %}{% set messages = messages[1:] %}" +
		"{% else %}{% set system = '' %}{% endif %}" +
		"{% for message in messages %}{% if message['role'] == 'user' %}" +
		"{{ bos_token + '[INST] ' + (system if loop.first else '') + message['content'] | trim + ' [/INST]' }}" +
		"{% else %}{{ ' ' + message['content'] | trim + ' ' + eos_token }}{% endif %}{% endfor %}",
	chat.Mistral: "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}" +
		"{{ '[INST] ' + message['content'] + ' [/INST]' }}" +
		"{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}",
}

// templateText reads --chat-template for gen: a family name (its Jinja
// text above) or a file holding a template. A file's template is stored
// as it is; one that pipeline/chat does not recognise is stored too (a
// later forge, or another runtime, may render it), with a warning.
func templateText(arg string, warn io.Writer) (string, error) {
	if t, ok := familyTemplates[chat.Family(arg)]; ok {
		return t, nil
	}
	b, err := os.ReadFile(arg)
	if err != nil {
		return "", usageErrorf("--chat-template %q: not chatml, llama2, llama3 or mistral, and not a readable file: %v", arg, err)
	}
	if _, err := chat.Parse(string(b)); err != nil {
		if errors.Is(err, chat.ErrNoTemplate) {
			return "", usageErrorf("--chat-template %q: the file is empty", arg)
		}
		fmt.Fprintf(warn, "forge: warning: --chat-template %q: %v; stored anyway\n", arg, err)
	}
	return string(b), nil
}

// withChatTemplate copies the GGUF file src to w with tokenizer.chat_template
// set to tmpl (replacing the file's own): every other metadata entry and
// every tensor's bytes as they are, in their order, through forge's GGUF
// writer. It made gguf/testdata/stories260K-chat.gguf.
func withChatTemplate(w io.Writer, src, tmpl string) error {
	f, err := gguf.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	gw := gguf.NewWriter(w)
	added := false
	for _, kv := range f.Metadata {
		v := kv.Value
		if kv.Key == "tokenizer.chat_template" {
			v, added = gguf.Str(tmpl), true
		}
		if err := gw.AddKV(kv.Key, v); err != nil {
			return fmt.Errorf("copy %s: %w", src, err)
		}
	}
	if !added {
		if err := gw.AddString("tokenizer.chat_template", tmpl); err != nil {
			return fmt.Errorf("copy %s: %w", src, err)
		}
	}
	for _, t := range f.Tensors {
		if err := gw.AddTensor(t.Name, t.Type, t.Dims...); err != nil {
			return fmt.Errorf("copy %s: %w", src, err)
		}
	}
	if err := gw.WriteHeader(); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	for i := range f.Tensors {
		data, err := f.TensorData(&f.Tensors[i])
		if err != nil {
			return fmt.Errorf("copy %s: %w", src, err)
		}
		if err := gw.WriteTensorData(f.Tensors[i].Name, data); err != nil {
			return fmt.Errorf("copy %s: %w", src, err)
		}
	}
	if err := gw.Close(); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return nil
}
