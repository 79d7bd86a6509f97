// Package tokenizer turns text into token ids and back, from the tokenizer
// metadata of a GGUF file, the way llama.cpp does it, so that a prompt gives
// the same ids here as there.
//
// Two tokenizer models are supported:
//
//   - SentencePiece ("llama"): spaces become U+2581 ("▁"), a space is put in
//     front of the text, and adjacent pieces are merged greedily by the score
//     of the merged token (highest first). Bytes that no token covers fall
//     back to the byte tokens "<0xNN>".
//   - Byte-level BPE ("gpt2"): the text is first cut into words by the
//     model's pre-tokenizer (regular expressions selected by
//     tokenizer.ggml.pre, implemented here as hand-written scanners because
//     Go's regexp has no lookahead), every byte of a word is mapped to a
//     printable rune (GPT-2's byte↔unicode table), and pairs are merged by
//     the rank of their merge rule (lowest first).
//
// Control and user-defined tokens ("<s>", "<|im_end|>", …) are cut out of the
// text before either model runs: user-defined ones always (as Hugging Face's
// tokenizers does), control ones only when EncodeOptions.ParseSpecial is set.
//
// Decoding maps each token back to bytes; Stream does it one token at a time
// and holds back an incomplete UTF-8 sequence until the token that finishes it
// arrives, so a terminal never sees half a character.
package tokenizer
