package gpu

import (
	"embed"
	"fmt"
	"path"
	"regexp"
	"sort"
	"strings"
)

// The kernel sources, one module per .cu file. They are plain CUDA/HIP C++
// that also build offline (`hipcc --offload-arch=gfx90a -c cu/matvec.cu`);
// at run time the local headers are pasted in so nvrtc/hiprtc need no
// include path.
//
//go:embed cu/*.cu cu/*.h
var sources embed.FS

var includeRE = regexp.MustCompile(`(?m)^[ \t]*#include[ \t]+"([^"]+)"[ \t]*$`)

// Modules lists the kernel source files ("matvec.cu", …) in a fixed order.
func Modules() []string {
	ents, err := sources.ReadDir("cu")
	if err != nil {
		panic(err) // the embedded folder always exists
	}
	var out []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".cu") {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

// Source returns the self-contained text of one module: the .cu file with
// each local header inlined once, in include order.
func Source(module string) (string, error) {
	var b strings.Builder
	seen := map[string]bool{}
	if err := expand(&b, module, seen, 0); err != nil {
		return "", err
	}
	return b.String(), nil
}

func expand(b *strings.Builder, name string, seen map[string]bool, depth int) error {
	if depth > 8 {
		return fmt.Errorf("gpu: kernel source %s: includes nested too deep", name)
	}
	if seen[name] {
		return nil
	}
	seen[name] = true
	text, err := sources.ReadFile(path.Join("cu", name))
	if err != nil {
		return fmt.Errorf("gpu: kernel source %s: %w", name, err)
	}
	s := strings.ReplaceAll(string(text), "#pragma once\n", "")
	last := 0
	for _, m := range includeRE.FindAllStringSubmatchIndex(s, -1) {
		b.WriteString(s[last:m[0]])
		if err := expand(b, s[m[2]:m[3]], seen, depth+1); err != nil {
			return fmt.Errorf("gpu: kernel source %s: %w", name, err)
		}
		last = m[1]
	}
	b.WriteString(s[last:])
	return nil
}
