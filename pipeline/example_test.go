package pipeline_test

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/pipeline"
)

// Open a model, stream a greedy continuation as it is generated, and look
// at how the load went.
func ExampleOpen() {
	path := filepath.Join(testmodels.Dir(), "stories260K-F32.gguf")
	m, err := pipeline.Open(context.Background(), path, pipeline.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer m.Close()
	res, err := m.Generate(context.Background(), "Once upon a time", pipeline.GenerateOptions{
		MaxTokens: 10,
		OnToken: func(t pipeline.Token) error {
			fmt.Print(t.Text)
			return nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("\n%d tokens, stop: %s\n", len(res.Tokens), res.Stop)
	fmt.Println("resident:", m.Resident().Wait(context.Background()) == nil)
	// Output:
	// , there was a little girl named Lily
	// 10 tokens, stop: max_tokens
	// resident: true
}
