// Package gguf reads and writes GGUF files, the model format of llama.cpp.
//
// A GGUF file is a little-endian header followed by a data section:
//
//	"GGUF" | version u32 | tensor count u64 | metadata count u64
//	metadata:     key (u64 length + bytes) | value type u32 | value
//	tensor infos: name | n_dims u32 | dims u64×n_dims | type u32 | offset u64
//	padding to general.alignment (default 32)
//	data section: each tensor at its offset (a multiple of the alignment)
//
// # Reading
//
// Open maps the file and decodes only the header, so opening a 100 GB model
// costs what opening a 100 MB one does. Token lists and other arrays are not
// decoded at Open: File.Strings and friends read them on request. Every
// header field is checked (counts and lengths against the bytes left, type
// numbers, dims, sizes, overflow, alignment, ranges, duplicates) and a
// violation is a *FormatError naming the field and its file offset.
//
//	f, err := gguf.Open("model.gguf")
//	cfg, err := f.Config()                       // <arch>.* hyper-parameters
//	t, _ := f.Tensor("token_embd.weight")
//	view, err := f.TensorData(t)                 // zero-copy, from the mapping
//	err = f.ReadTensor(t, 0, buf)                // copy; faults become errors
//
// OpenReaderAt reads through an io.ReaderAt instead of a mapping.
//
// # A file that changes under its mapping
//
// A mapped file truncated while open (a download restarting, `forge gen -o`
// writing over it) makes every read of the lost pages raise SIGBUS, which
// kills a Go process. File.Check (one fstat) says whether the open file
// still has the size and modification time it was mapped with, as a
// *ChangedError. Code that reads views anyway does it where a fault is an
// error: CopyMapped, ReadTensor and CatchFault turn it into a *FaultError,
// and goroutines that run with debug.SetPanicOnFault on turn what they
// recover into one with AsFault. Both match MappingBroken: the holder of
// the mapping should stop using it.
//
// # Writing
//
// Writer streams a version 3 file. Declare the metadata and the tensors,
// write the header, then give each tensor's bytes in declaration order; only
// the header is held in memory.
//
//	w := gguf.NewWriter(out)                     // out: an *os.File, a bytes.Buffer, …
//	w.AddString("general.architecture", "llama")
//	w.AddUint32("llama.block_count", 2)
//	w.AddStrings("tokenizer.ggml.tokens", vocab)
//	w.AddKV("some.nested", gguf.ArrayOf([]gguf.Value{gguf.ArrayOf([]int32{1, 2})}))
//	w.AddTensor("token_embd.weight", gguf.TypeQ8_0, 64, 512)  // dims row-first
//	w.WriteHeader()
//	w.WriteTensorData("token_embd.weight", data) // or WriteTensorFrom(name, reader)
//	w.Close()                                    // checks every tensor was written
//
// Errors are sticky: after the first one every call, Close included,
// returns it, so a generator may check only the error from Close.
//
// SkipTensorData leaves a tensor's bytes as zeros; on an *os.File it seeks
// instead of writing, which makes sparse files (a 100 GB test model that
// takes no disk space). Metadata values read from one file (including lazy
// arrays) can be passed to AddKV of a Writer to copy them into another.
package gguf
