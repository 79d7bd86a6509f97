package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunConstrained: forge run --json-schema, --json-schema-file,
// --grammar and --grammar-file hold a random-weight model's output to the
// schema or grammar; bad ones and two at once are usage errors.
func TestRunConstrained(t *testing.T) {
	m := chatModel(t, "tiny")
	dir := t.TempDir()
	schemaFile := filepath.Join(dir, "s.json")
	if err := os.WriteFile(schemaFile, []byte(weatherSchema), 0o600); err != nil {
		t.Fatal(err)
	}
	grammarFile := filepath.Join(dir, "g.gbnf")
	if err := os.WriteFile(grammarFile, []byte("root ::= \"yes\" | \"no\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--json-schema", weatherSchema}, {"--json-schema-file", schemaFile}, {"-j", weatherSchema}} {
		out, _, err := forgeCLI(t, nil, append([]string{"run", m, "-p", "Weather:", "-n", "150", "--seed", "2", "-t", "1", "--json"}, args...)...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		var res runResult
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatal(err)
		}
		if res.Stop != "eog" {
			t.Errorf("%v: stop %q", args, res.Stop)
		}
		validateWeather(t, strings.Join(args, " "), res.Text)
	}
	for _, args := range [][]string{{"--grammar", `root ::= "yes" | "no"`}, {"--grammar-file", grammarFile}} {
		out, _, err := forgeCLI(t, nil, append([]string{"run", m, "-p", "Answer:", "-n", "10", "-t", "1", "--temp", "0"}, args...)...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if out = strings.TrimSuffix(out, "\n"); out != "yes" && out != "no" {
			t.Errorf("%v: output %q", args, out)
		}
	}
	for _, args := range [][]string{
		{"--grammar", "root ::= root"},
		{"--json-schema", "{not json"},
		{"--json-schema-file", filepath.Join(dir, "missing.json")},
		{"--grammar", `root ::= "x"`, "--json-schema", "{}"},
	} {
		if _, _, err := forgeCLI(t, nil, append([]string{"run", m, "-p", "x", "-n", "4"}, args...)...); exitCode(err) != 2 {
			t.Errorf("%v: %v (status %d), want a usage error", args, err, exitCode(err))
		}
	}
}
