package archtest

import (
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/pipeline/model"
)

// OpenWeights opens the GGUF file at path for the rest of the test and
// returns its configuration and weights (views of the file, nothing
// loaded): the start of every test that runs a model without the load
// pipeline.
func OpenWeights(t testing.TB, path string) (model.Config, *model.FileWeights) {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	cfg, err := model.ConfigFromFile(f)
	if err != nil {
		t.Fatal(err)
	}
	fw, err := model.NewFileWeights(f, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, fw
}
