// Package pipeline is forge's public Go API: open a model, watch it load
// (progress events, readiness futures), generate with a context, close.
// Architectures, the tokenizer and the sampler nest below it.
package pipeline
