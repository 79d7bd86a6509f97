// Package actors holds the loader, dequantizer, uploader and executor actors
// (protoactor-go) of the load pipeline and the messages between them. The
// executor runs a model handed to it through a small interface, so this
// package never imports pipeline.
package actors
