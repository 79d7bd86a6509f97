package gguf

import (
	"fmt"
	"strconv"
	"strings"
)

// blockPrefix starts the name of every tensor that belongs to a transformer
// block: "blk.<i>.<name>".
const blockPrefix = "blk."

// BlockTensor is the name of block i's tensor name ("blk.3.attn_q.weight"
// for 3, "attn_q.weight").
func BlockTensor(i int, name string) string {
	return blockPrefix + strconv.Itoa(i) + "." + name
}

// BlockOf parses a tensor name: for "blk.<i>.…" it returns i and true; for
// a name outside the blocks (token_embd.weight) -1 and false. A name that
// starts with "blk." but whose block number is not a non-negative decimal
// number is an error, so that every reader of a file (the loader's plan,
// the shape checks, the progress display) agrees on which tensors belong
// to which block.
func BlockOf(name string) (layer int, inBlock bool, err error) {
	rest, ok := strings.CutPrefix(name, blockPrefix)
	if !ok {
		return -1, false, nil
	}
	num, _, _ := strings.Cut(rest, ".")
	l, err := strconv.Atoi(num)
	if err != nil || l < 0 || num != strconv.Itoa(l) {
		return -1, true, fmt.Errorf("gguf: tensor %q: block number %q is not a number", name, num)
	}
	return l, true, nil
}
