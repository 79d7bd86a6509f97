// Package actors is forge's load pipeline: the loader, dequantizer,
// uploader and executor actors (protoactor-go) and their messages, and
// the readiness futures. The progress events they publish, and the bus
// that carries them, are package progress (a leaf below this one).
//
// One System runs per model:
//
//	loader ──chunks──▶ readers ──▶ loader ──▶ dequantizer pool ──▶ uploader ──▶ futures
//	  (priority order: globals, then blk.0 … blk.N-1)                          │
//	executor ◀── waits per layer (System.WaitLayer) ◀──────────────────────────┘
//
// The actors:
//
//   - The loader owns the mapped file. It splits each unit (the globals —
//     token_embd, output_norm, output — or one block) into chunks of whole
//     rows and hands them, in priority order, to several reader actors; at
//     most MaxInflight chunks (or InflightBytes) are between reading and
//     upload.
//   - The dequantizer pool turns chunks into what the backend consumes:
//     a pass-through for types its kernels read, F32 otherwise (Converter).
//   - The uploader owns the Uploader: one weight allocation sized from the
//     plan (Reserve), chunks placed into it, and per unit a Fence that
//     completes when its copies have landed. On the CPU (HostUploader) the
//     mapped file itself is the allocation and weights are zero-copy views;
//     a GPU Uploader copies into a device arena on a copy stream and records
//     one event per unit, which the executor's stream waits on.
//   - The executor owns the model (Generator: backend, KV cache, scratch)
//     and runs requests one at a time, each on a goroutine that reports
//     back with a message: no Receive ever blocks on another actor.
//
// Readiness futures go Pending → Enqueued → Resident, or Failed with a
// LoadError naming the layer and tensor. A failure fails its unit and every
// unit after it in load order; a cancelled load or Close fails everything
// still pending, so no waiter hangs. Events are published on the actor
// system's EventStream through a progress.Bus whose subscribers only
// queue, so they never slow the pipeline.
//
// This package never imports pipeline: the executor runs a Generator that
// pipeline builds from an architecture and hands over in StartExecutor.
package actors
