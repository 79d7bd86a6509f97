package pipeline

import (
	"context"
	"fmt"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/kernels"
)

// Strategy is how weights get to the device: Prefetch (the default),
// Eager, Lazy or HostF32. It is pipeline's own type (Open hands package
// actors its equivalent), so a caller needs no other package to choose
// one.
type Strategy int

// The load strategies. They change when units are loaded and whether they
// are converted, not the path the bytes take.
const (
	// Prefetch streams every unit in priority order and runs requests as
	// soon as the model is ready, each layer waiting on its own future.
	Prefetch Strategy = iota
	// Eager streams every unit the same way but starts requests only once
	// all are resident.
	Eager
	// Lazy loads the globals, then a layer only when a request first needs
	// it (no prefetch); concurrent first uses load it once. A mixture of
	// experts' experts load only when a router picks them, so those no
	// request routes to never load and Model.Resident does not resolve
	// before Close (Model.LazyExperts says so).
	Lazy
	// HostF32 dequantizes every tensor to F32 on the host, one allocation
	// per tensor, and starts once all are resident: the design forge
	// replaces, kept for comparison.
	HostF32
)

// actorsStrategies maps each Strategy onto the one package actors runs,
// by name, so the two lists cannot drift apart silently.
var actorsStrategies = [...]actors.Strategy{
	Prefetch: actors.Prefetch,
	Eager:    actors.Eager,
	Lazy:     actors.Lazy,
	HostF32:  actors.HostF32,
}

// toActors is s as package actors runs it (an unknown value stays
// unknown: actors names it Strategy(N)).
func (s Strategy) toActors() actors.Strategy {
	if s >= 0 && int(s) < len(actorsStrategies) {
		return actorsStrategies[s]
	}
	return actors.Strategy(s)
}

// String is the strategy's name: "prefetch", "eager", "lazy" or
// "host-f32".
func (s Strategy) String() string { return s.toActors().String() }

// ParseStrategy reads "prefetch", "eager", "lazy" or "host-f32" ("" is
// Prefetch).
func ParseStrategy(name string) (Strategy, error) {
	a, err := actors.ParseStrategy(name)
	if err != nil {
		return 0, err
	}
	for s, as := range actorsStrategies {
		if as == a {
			return Strategy(s), nil
		}
	}
	return 0, fmt.Errorf("pipeline: load strategy %q has no pipeline.Strategy", name)
}

// Memory accounts (and optionally caps) the memory a device gives models:
// weights, KV cache and scratch. With a limit, asking past it fails like a
// device out of memory. One Memory may be shared by several models on the
// same device. Make it with NewMemory; it wraps package actors' accountant,
// which the loader and uploaders charge.
type Memory struct{ acct *actors.Memory }

// NewMemory returns an accountant with a limit in bytes (≤ 0: none).
func NewMemory(limit int64) *Memory { return &Memory{acct: actors.NewMemory(limit)} }

// Limit is the cap given to NewMemory (≤ 0: none).
func (m *Memory) Limit() int64 { return m.acct.Limit() }

// InUse is the number of bytes held now.
func (m *Memory) InUse() int64 { return m.acct.InUse() }

// Peak is the most bytes ever held at once.
func (m *Memory) Peak() int64 { return m.acct.Peak() }

// Hooks slow the pipeline down or inject faults at the stages where real
// ones happen (tests, benchmarks). Nil hooks cost nothing.
type Hooks struct {
	// Read runs on a reader before it reads bytes [off, off+n) of a
	// tensor; it may sleep (a slow disk; it must return when ctx is done)
	// or return an error (an unreadable range).
	// A mixture's stacked expert tensor is read expert by expert: off
	// counts from the tensor's start, so expert e's rows are the range
	// [e·Size/Experts, (e+1)·Size/Experts).
	Read func(ctx context.Context, tensor string, off, n int64) error
	// Upload runs on the uploader before each chunk of a tensor is
	// uploaded; an error is a failed upload.
	Upload func(tensor string) error
}

// toActors is h as Open hands it to package actors.
func (h Hooks) toActors() actors.Hooks { return actors.Hooks{Read: h.Read, Upload: h.Upload} }

// Options configure Open.
type Options struct {
	Strategy Strategy
	// Device is "cpu", "gpu" (= "gpu:0"), "gpu:N", "gpu:N,M,…" or
	// "gpu:all" (the model split by layers over those GPUs; see Split),
	// or "auto" ("" is
	// auto: a GPU if package rocm finds a driver and a device, else the
	// CPU; slog Info names the GPU, Debug the reason for the CPU). On a GPU
	// the weights stream into one device arena through
	// actors.DeviceUploader.
	Device string
	// Backend runs the model on a backend the caller made (and closes);
	// it overrides Device.
	Backend kernels.Backend
	// Backends, two or more, split the model by layers over backends the
	// caller made (and closes), in order; it overrides Device. Tests split
	// a model over two CPU backends this way.
	Backends []kernels.Backend
	// Split is each device's share of the layers of a split model
	// ("--split 1,1": half each); nil: in proportion to each GPU's free
	// memory (the first less the globals it holds), equal shares for
	// Backends.
	Split []float64
	// Threads is the CPU backend's worker count (0: every core).
	Threads int
	// Ctx is the KV cache length in positions (0: the model's, at most
	// 4096); Batch the most prompt tokens per forward step (0: 512).
	Ctx, Batch int
	// Readers is the number of file readers (0: 4 on the CPU, 8 on a GPU,
	// where they page the file in ahead of the copies).
	Readers int
	// ChunkBytes is the unit of reading, conversion and upload, rounded to
	// whole rows (0: 4 MiB).
	ChunkBytes int64
	// Memory accounts weights, KV cache and scratch; with a limit, asking
	// past it fails like a device out of memory. nil: a private accountant
	// without limit.
	Memory *Memory
	// Hooks are for tests and benchmarks: a slow disk, a failing read or
	// upload.
	Hooks Hooks
	// ExpertProfiles is a folder of expert usage profiles (a mixture of
	// experts only; "" none): the experts load most used first, as the
	// profile of this file (by its identity: size, tensor index, router
	// bytes) recorded in earlier runs, instead of by index, and this
	// model's requests add their routing to it at Close (the tokens
	// routed to each expert, by single requests and batched steps
	// alike; models closing at once merge their counts). Not for a split
	// model.
	ExpertProfiles string
	// Batching runs requests together (continuous batching, see
	// Batching); off by default here, on in the Engine.
	Batching Batching
	// Upload tunes the GPU uploader (benchmarks; the zero value is the
	// measured default).
	Upload UploadTuning
	// NoGraph runs every decode step op by op even where the backend can
	// record it once and replay it as a GPU graph; for comparisons
	// (forge run --no-graph).
	NoGraph bool
	// MMQ chooses the GPU's int8 tensor-core kernels for MatMul's rows
	// (gpu.Options.MMQ: "" the measured defaults, "off", or variants per
	// type), for comparisons (forge --gpu-mmq).
	MMQ string

	// uploader places the weights on the device; nil: the backend's
	// (on the CPU, zero-copy views of the mapped file; on a GPU an
	// actors.DeviceUploader, per tensor under HostF32). Tests set
	// actors.StreamUploader for the asynchronous path; it is not part of
	// the API, which names no type of package actors.
	uploader actors.Uploader

	// shared is the Engine's GPU, opened once for all its models (nil:
	// the model opens its own; see sharedGPU).
	shared *sharedGPU
	// afterRelease holds the device's weight reservation until each
	// channel is closed: the released uploaders of the models an Engine
	// evicted for this one, whose other teardown runs beside the load.
	afterRelease []<-chan struct{}
	// file is the model's file, already open and held for this model (an
	// Engine's pinned file, released by Close), and pinned its kept
	// registration for the uploader.
	file   *fileRef
	pinned *actors.PinnedFile
	// kvFrom offers the evicted models' KV pool (kvHandoff).
	kvFrom *kvHandoff
}

// UploadTuning sizes the GPU uploader's helpers (see
// actors.DeviceUploader; zero fields take its defaults).
type UploadTuning struct {
	// Register copies from the mapped file, registered read-only, instead
	// of through the pinned ring (slower on the H100 host: for
	// comparisons; --gpu-upload reg sets it from the CLI).
	Register bool
	// Unpaced lets the load queue every chunk for the staging ring at
	// once, as before the loader paced them (actors.DeviceUploader's
	// Unpaced: for comparisons; --gpu-upload unpaced).
	Unpaced bool
	// RingBuffers × RingBytes is the pinned staging ring; Stagers the
	// goroutines filling it.
	RingBuffers, RingBytes, Stagers int
	// RegThreads threads register the mapped file read-only in ranges of
	// at most RegBytes (with Register).
	RegThreads int
	RegBytes   int64
}
