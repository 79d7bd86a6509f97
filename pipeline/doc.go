// Package pipeline is forge's public Go API: open a model, watch it load
// (progress events, readiness futures), generate with a context, close.
// Architectures (model), the tokenizer and the sampler nest below it.
//
// Open parses the file's metadata and returns; the weights then stream to
// the device through the actors of package actors, in priority order: the
// embedding, output norm and LM head first (Ready), then blocks 0…N-1.
// A request starts as soon as the model is ready and each layer of its
// forward pass waits for its own weights, so the first token does not wait
// for a whole model to be loaded the slow way:
//
//	m, err := pipeline.Open(ctx, "model.gguf", pipeline.Options{})
//	if err != nil { … }
//	defer m.Close()
//	res, err := m.Generate(ctx, "Once upon a time", pipeline.GenerateOptions{
//		MaxTokens: 64,
//		OnToken:   func(t pipeline.Token) error { fmt.Print(t.Text); return nil },
//	})
//
// For servers and agents, an Engine loads models on demand and serves
// requests on them (continuous batching by default). Engine.Stream streams
// a request as an iter.Seq2[Delta, error] decoupled from the executor: a
// slow or gone reader never holds up a step, and breaking out of the loop
// cancels the request. A Session is a conversation bound to a model whose
// history the prefix cache keeps. Requests take tools (chat.Tool): the
// model's chat template renders them and its calls come back parsed in
// EngineResult.ToolCalls. Errors are typed (ErrUnknownModel, ErrBudget,
// ErrEngineClosed, *ContextLengthError with its counts), results carry
// their Usage (prompt, first-token and decode timings) and FinishReason.
//
// Subscribe streams typed progress events (tensor read, converted,
// uploaded; layer ready; model ready; all resident; request started; first
// token; token; done; error) with byte counts and monotonic times since
// Open; EventJSON turns one into a JSON line. Strategies other than the
// default Prefetch exist for comparison: Eager, Lazy and HostF32.
package pipeline
