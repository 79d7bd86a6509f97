// Package progress is the progress events of a model's load and of its
// requests (TensorRead … AllResident, RequestStarted … Done, Error) and
// the Bus that carries them to subscribers.
//
// The actors publish them (package actors: the loader, uploader and
// executor) and package pipeline hands them to users under its own names
// (pipeline.Event, pipeline.Subscription, …). They live in this leaf,
// below actors, so that both can import them: pipeline imports actors,
// and actors must never import pipeline. The package imports nothing of
// forge but gguf (a converted tensor's types).
package progress
