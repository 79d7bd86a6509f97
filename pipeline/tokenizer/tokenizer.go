package tokenizer

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/forge-llm/forge/gguf"
)

// Token types, as stored in tokenizer.ggml.token_type (llama.cpp's
// llama_token_type).
const (
	TypeUndefined   int32 = 0
	TypeNormal      int32 = 1
	TypeUnknown     int32 = 2
	TypeControl     int32 = 3
	TypeUserDefined int32 = 4
	TypeUnused      int32 = 5
	TypeByte        int32 = 6
)

// EncodeOptions says what Encode adds and parses besides the plain text.
type EncodeOptions struct {
	AddBOS bool // put the BOS token first
	AddEOS bool // put the EOS token last
	// ParseSpecial cuts the text of control tokens ("<s>", "<|im_end|>")
	// out of the text as those tokens. Without it, their text is ordinary
	// text. User-defined tokens are always cut out, as in llama.cpp.
	ParseSpecial bool
	// Continue encodes text that follows text encoded before (the rest of
	// a prompt whose start kept its ids): no SentencePiece dummy-prefix
	// space goes in front of it.
	Continue bool
}

// Tokenizer encodes and decodes text with one vocabulary. It is read-only
// after New and safe for concurrent use.
type Tokenizer struct {
	model string // "llama" (SentencePiece) or "gpt2" (byte-level BPE)
	pre   string

	tokens []string  // token texts; an empty text is renamed as llama.cpp does
	scores []float32 // SentencePiece merge priority; 0 when absent
	types  []int32   // token types, TypeNormal when absent
	ids    map[string]int32

	bos, eos, unk, eot int32
	addBOS, addEOS     bool
	addSpacePrefix     bool

	eog      map[int32]bool
	specials []int32 // control, user-defined and unknown tokens, longest text first

	pieces [][]byte // bytes of each token when decoded

	spm *spmModel
	bpe *bpeModel
}

// FromFile builds the tokenizer of an open GGUF file.
func FromFile(f *gguf.File) (*Tokenizer, error) {
	meta, err := f.Tokenizer()
	if err != nil {
		return nil, err
	}
	t, err := New(meta)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.Path, err)
	}
	return t, nil
}

// Texts that llama.cpp recognises whatever the file says, because converters
// do not always mark them: each found token becomes a control token (so plain
// text never produces it), and some end generation.
var (
	// eotTexts: the first one found is the end-of-turn token when the file
	// names none (llama.cpp takes whichever its hash map yields first).
	eotTexts = []string{"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
		"<|end_of_text|>", "<EOT>", "_<EOT>", "<｜end▁of▁sentence｜>", "<end_of_utterance>"}
	// eogTexts end generation.
	eogTexts = []string{"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",
		"<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>",
		"<|end_of_text|>", "<end_of_utterance>"}
	// fimTexts are fill-in-the-middle markers; the last group (pad, repo,
	// file separator) also ends generation.
	fimTexts = []string{"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
		"<|code_prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
		"<|code_suffix|>", "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
		"<|code_middle|>"}
	fimEOGTexts = []string{"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "<|fim_repo|>", "<|repo_name|>",
		"<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>"}
	// harmonyTexts (gpt-oss) are always printed: user-defined.
	harmonyTexts = []string{"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}
)

// markSpecial applies llama.cpp's recognition of special tokens by text
// (llama_vocab::load): see the lists above.
func (t *Tokenizer) markSpecial() {
	control := func(s string) (int32, bool) {
		id, ok := t.ids[s]
		if ok {
			t.types[id] = TypeControl
		}
		return id, ok
	}
	if t.eot < 0 {
		for _, s := range eotTexts {
			if id, ok := t.ids[s]; ok {
				t.eot = id
				break
			}
		}
	}
	if t.eot >= 0 {
		t.types[t.eot] = TypeControl
	}
	for _, s := range fimTexts {
		control(s)
	}
	for _, s := range fimEOGTexts {
		if id, ok := control(s); ok {
			t.eog[id] = true
		}
	}
	for _, s := range eogTexts {
		if id, ok := control(s); ok {
			t.eog[id] = true
		}
	}
	if id, ok := control("<|eom_id|>"); ok {
		t.eog[id] = true
	}
	for _, s := range harmonyTexts {
		if id, ok := t.ids[s]; ok {
			t.types[id] = TypeUserDefined
		}
	}
	for _, id := range []int32{t.eos, t.eot} {
		if id >= 0 {
			t.eog[id] = true
		}
	}
	// gpt-oss: with "<|return|>" and "<|call|>", "<|end|>" only ends a
	// message, not the generation.
	ret, r1 := t.ids["<|return|>"]
	call, r2 := t.ids["<|call|>"]
	end, r3 := t.ids["<|end|>"]
	if r1 && r2 && r3 && t.eog[ret] && t.eog[call] && t.eog[end] {
		delete(t.eog, end)
		t.types[end] = TypeUserDefined
	}
}

// New builds a tokenizer from GGUF tokenizer metadata.
func New(meta *gguf.TokenizerMeta) (*Tokenizer, error) {
	n := len(meta.Tokens)
	if n == 0 {
		return nil, fmt.Errorf("tokenizer: model %q: empty vocabulary", meta.Model)
	}
	t := &Tokenizer{
		model:          meta.Model,
		pre:            meta.Pre,
		tokens:         make([]string, n),
		scores:         make([]float32, n),
		types:          make([]int32, n),
		ids:            make(map[string]int32, n),
		bos:            meta.BOS,
		eos:            meta.EOS,
		unk:            meta.UNK,
		eot:            meta.EOT,
		addBOS:         meta.AddBOS,
		addEOS:         meta.AddEOS,
		addSpacePrefix: meta.AddSpacePrefix,
		eog:            map[int32]bool{},
	}
	if meta.Scores != nil && len(meta.Scores) != n {
		return nil, fmt.Errorf("tokenizer: %d scores for %d tokens", len(meta.Scores), n)
	}
	if meta.TokenTypes != nil && len(meta.TokenTypes) != n {
		return nil, fmt.Errorf("tokenizer: %d token types for %d tokens", len(meta.TokenTypes), n)
	}
	for i, s := range meta.Tokens {
		if s == "" {
			s = "[EMPTY_" + strconv.Itoa(i) + "]" // llama.cpp's name for it
		}
		t.tokens[i] = s
		t.ids[s] = int32(i) // a duplicate text maps to its last id, as in llama.cpp
		t.types[i] = TypeNormal
		if meta.TokenTypes != nil {
			t.types[i] = meta.TokenTypes[i]
		}
		if meta.Scores != nil {
			t.scores[i] = meta.Scores[i]
		}
	}
	for _, id := range []int32{t.bos, t.eos, t.unk, t.eot} {
		if id >= int32(n) {
			return nil, fmt.Errorf("tokenizer: special token id %d outside the vocabulary of %d", id, n)
		}
	}

	switch meta.Pre {
	case "chatglm-bpe", "glm4":
		t.bos = -1 // llama.cpp: these vocabularies have no BOS
	}
	t.markSpecial()

	for i, ty := range t.types {
		if ty == TypeControl || ty == TypeUserDefined || ty == TypeUnknown {
			t.specials = append(t.specials, int32(i))
		}
	}
	// Longest first, so that "<|im_end|>" is cut before a shorter token
	// that is a part of it; equal lengths by id, for a stable order.
	slices.SortStableFunc(t.specials, func(a, b int32) int {
		return cmp.Compare(len(t.tokens[b]), len(t.tokens[a]))
	})

	var err error
	switch meta.Model {
	case "llama":
		t.spm = newSPM(t)
	case "gpt2":
		t.bpe, err = newBPE(t, meta.Merges, meta.Pre)
	default:
		err = fmt.Errorf("tokenizer: unsupported tokenizer model %q (tokenizer.ggml.model)", meta.Model)
	}
	if err != nil {
		return nil, err
	}
	t.pieces = make([][]byte, n)
	for i := range t.pieces {
		t.pieces[i] = t.decodeToken(int32(i))
	}
	return t, nil
}

// VocabSize is the number of tokens.
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

// Model is tokenizer.ggml.model: "llama" or "gpt2".
func (t *Tokenizer) Model() string { return t.model }

// Pre is tokenizer.ggml.pre, the pre-tokenizer family of a BPE vocabulary.
func (t *Tokenizer) Pre() string { return t.pre }

// BOS is the beginning-of-sequence token, -1 when there is none.
func (t *Tokenizer) BOS() int32 { return t.bos }

// EOS is the end-of-sequence token, -1 when there is none.
func (t *Tokenizer) EOS() int32 { return t.eos }

// IsEOG reports whether id ends generation (EOS, EOT, "<|im_end|>", …).
func (t *Tokenizer) IsEOG(id int32) bool { return t.eog[id] }

// ShouldAddBOS and ShouldAddEOS are the file's add_bos/add_eos flags
// (llama.cpp's defaults when absent): what a caller that adds "the model's
// special tokens" passes in EncodeOptions.
func (t *Tokenizer) ShouldAddBOS() bool { return t.addBOS }

// ShouldAddEOS: see ShouldAddBOS.
func (t *Tokenizer) ShouldAddEOS() bool { return t.addEOS }

// Token is the text of id as stored in the vocabulary ("▁Once", "Ġthe").
func (t *Tokenizer) Token(id int32) string {
	if id < 0 || int(id) >= len(t.tokens) {
		return ""
	}
	return t.tokens[id]
}

// TokenType is the type of id (TypeNormal, TypeControl, …).
func (t *Tokenizer) TokenType(id int32) int32 {
	if id < 0 || int(id) >= len(t.types) {
		return TypeUndefined
	}
	return t.types[id]
}

// fragment is a part of the text being encoded: raw text, or a special
// token already cut out of it (tok >= 0).
type fragment struct {
	text string
	tok  int32
}

// Encode turns text into token ids.
func (t *Tokenizer) Encode(text string, opts EncodeOptions) ([]int32, error) {
	return t.EncodeContext(context.Background(), text, opts)
}

// EncodeContext is Encode that gives up with ctx's error once ctx is done:
// a long text (a prompt sent to a server) is checked every few hundred
// words, so a request cancelled by its client stops tokenizing.
func (t *Tokenizer) EncodeContext(ctx context.Context, text string, opts EncodeOptions) ([]int32, error) {
	return t.encode(ctx, t.partition(text, opts.ParseSpecial), opts)
}

// Segment is a part of a text to encode, with its own special-token
// parsing: a chat prompt is the template's text, whose control tokens
// ("<|im_start|>", "</s>") are meant, and the messages' contents, where
// the same text is only text.
type Segment struct {
	Text string
	// ParseSpecial cuts control tokens out of this segment (see
	// EncodeOptions.ParseSpecial, which EncodeSegments ignores).
	ParseSpecial bool
}

// EncodeSegments encodes the concatenation of segs, each segment's special
// tokens parsed as it says. Plain text on both sides of a segment boundary
// is encoded as one text, exactly as if the segments had been one string
// whose control tokens were found only in the segments that parse them.
func (t *Tokenizer) EncodeSegments(ctx context.Context, segs []Segment, opts EncodeOptions) ([]int32, error) {
	var frags []fragment
	for _, sg := range segs {
		for _, f := range t.partition(sg.Text, sg.ParseSpecial) {
			if n := len(frags); f.tok < 0 && n > 0 && frags[n-1].tok < 0 {
				frags[n-1].text += f.text
				continue
			}
			frags = append(frags, f)
		}
	}
	return t.encode(ctx, frags, opts)
}

// checkEvery is how many words are encoded between looks at the context.
const checkEvery = 256

func (t *Tokenizer) encode(ctx context.Context, frags []fragment, opts EncodeOptions) ([]int32, error) {
	var out []int32
	if opts.AddBOS {
		if t.bos < 0 {
			return nil, fmt.Errorf("tokenizer: BOS asked for but the vocabulary has none")
		}
		out = append(out, t.bos)
	}
	var err error
	if t.spm != nil {
		out, err = t.spm.encode(ctx, frags, out, opts.Continue)
	} else {
		out, err = t.bpe.encode(ctx, frags, out)
	}
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if opts.AddEOS {
		if t.eos < 0 {
			return nil, fmt.Errorf("tokenizer: EOS asked for but the vocabulary has none")
		}
		out = append(out, t.eos)
	}
	return out, nil
}

// partition cuts special tokens out of text, as llama.cpp's
// tokenizer_st_partition: for each special token, longest first, every
// occurrence in the remaining raw fragments, left to right, becomes a token
// fragment. Control and unknown tokens take part only with parseSpecial.
func (t *Tokenizer) partition(text string, parseSpecial bool) []fragment {
	if text == "" {
		return nil
	}
	frags := []fragment{{text: text, tok: -1}}
	var next []fragment
	for _, id := range t.specials {
		ty := t.types[id]
		if !parseSpecial && (ty == TypeControl || ty == TypeUnknown) {
			continue
		}
		s := t.tokens[id]
		next = next[:0]
		for _, f := range frags {
			if f.tok >= 0 || !strings.Contains(f.text, s) {
				next = append(next, f)
				continue
			}
			rest := f.text
			for {
				k := strings.Index(rest, s)
				if k < 0 {
					break
				}
				if k > 0 {
					next = append(next, fragment{text: rest[:k], tok: -1})
				}
				next = append(next, fragment{tok: id})
				rest = rest[k+len(s):]
			}
			if rest != "" {
				next = append(next, fragment{text: rest, tok: -1})
			}
		}
		frags, next = next, frags
	}
	return frags
}
