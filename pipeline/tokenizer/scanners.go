package tokenizer

// The regular expressions of the pre-tokenizers, as hand-written scanners.
// Each matcher gives the length of the leftmost-alternative match at one
// position, exactly as a backtracking engine (std::regex in llama.cpp,
// Oniguruma in Hugging Face tokenizers) would: alternatives are tried in
// order and the first that matches wins, quantifiers are greedy and give
// back characters only when what follows needs them.

// matchContraction is 's|'t|'re|'ve|'m|'ll|'d, or with fold set the
// ASCII-case-insensitive (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]).
func matchContraction(c []rune, i int, fold bool) int {
	if c[i] != '\'' || i+1 >= len(c) {
		return 0
	}
	low := func(r rune) rune {
		if fold && r >= 'A' && r <= 'Z' {
			return r + ('a' - 'A')
		}
		return r
	}
	switch low(c[i+1]) {
	case 's', 't', 'm', 'd':
		return 2
	}
	if i+2 >= len(c) {
		return 0
	}
	a, b := low(c[i+1]), low(c[i+2])
	if (a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l') {
		return 3
	}
	return 0
}

// run returns the end of the run of runes from i on that satisfy in.
func run(c []rune, i int, in func(rune) bool) int {
	for i < len(c) && in(c[i]) {
		i++
	}
	return i
}

// spaceRunNoLookahead is \s+(?!\S) at i: the whole whitespace run when it
// reaches the end of the text, else all of it but the last whitespace
// (which then starts the next word, e.g. the space of " world"); 0 when
// that leaves nothing.
func spaceRunNoLookahead(c []rune, i int) int {
	e := run(c, i, isSpace)
	if e == len(c) {
		return e - i
	}
	return max(e-i-1, 0)
}

// optSpaceThen is " ?X+": an optional ASCII space, then one or more runes
// of class in. Greedy: the space is taken when a rune of the class follows.
func optSpaceThen(c []rune, i int, in func(rune) bool) int {
	j := i
	if c[j] == ' ' && j+1 < len(c) && in(c[j+1]) {
		j++
	}
	if !in(c[j]) {
		return 0
	}
	return run(c, j, in) - i
}

// matchGPT2 implements GPT-2's pre-tokenizer regex
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
//
// A whitespace other than ' ' that is followed by a non-space matches no
// alternative; scan then emits it as a piece of its own.
func matchGPT2(c []rune, i int) int {
	if n := matchContraction(c, i, false); n > 0 {
		return n
	}
	if n := optSpaceThen(c, i, isLetter); n > 0 {
		return n
	}
	if n := optSpaceThen(c, i, isNumber); n > 0 {
		return n
	}
	if n := optSpaceThen(c, i, isOther); n > 0 {
		return n
	}
	return spaceRunNoLookahead(c, i)
}

// matchLlama3 implements Llama 3's pre-tokenizer regex (as adapted by
// llama.cpp, with the ASCII-only case folding of the original (?i:…))
//
//	(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func matchLlama3(c []rune, i int) int { return matchLlama3Digits(c, i, 3) }

// matchQwen2 implements Qwen2's pre-tokenizer regex: Llama 3's with single
// digits
//
//	(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func matchQwen2(c []rune, i int) int { return matchLlama3Digits(c, i, 1) }

// matchLlama3Digits is the Llama 3 regex with \p{N}{1,maxDigits}.
func matchLlama3Digits(c []rune, i, maxDigits int) int {
	if n := matchContraction(c, i, true); n > 0 {
		return n
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+ : one optional prefix rune (a space,
	// punctuation, a symbol…) glued to a run of letters.
	j := i
	if f := flags(c[j]); f&(fLetter|fNumber) == 0 && !isCRLF(c[j]) && j+1 < len(c) && isLetter(c[j+1]) {
		j++
	}
	if isLetter(c[j]) {
		return run(c, j, isLetter) - i
	}
	// \p{N}{1,3}
	if isNumber(c[i]) {
		e := run(c, i, isNumber)
		return min(e-i, maxDigits)
	}
	// ' ?[^\s\p{L}\p{N}]+[\r\n]*'
	if n := optSpaceThen(c, i, isOther); n > 0 {
		return run(c, i+n, isCRLF) - i
	}
	// \s*[\r\n]+ : the whitespace run up to and including its last CR/LF.
	e := run(c, i, isSpace)
	for k := e - 1; k >= i; k-- {
		if isCRLF(c[k]) {
			return k + 1 - i
		}
	}
	// \s+(?!\S), then \s+ for a single whitespace before a non-space.
	if n := spaceRunNoLookahead(c, i); n > 0 {
		return n
	}
	return e - i
}

// classPlus is [X]+ for the class in.
func classPlus(in func(rune) bool) matcher {
	return func(c []rune, i int) int { return run(c, i, in) - i }
}

// classOne is [X] (a single rune) for the class in.
func classOne(in func(rune) bool) matcher {
	return func(c []rune, i int) int {
		if in(c[i]) {
			return 1
		}
		return 0
	}
}

// spaceOptPlus is \s?[X]+ for the class in. \s? is greedy: it takes a
// whitespace when a rune of the class follows it, and otherwise the match
// may still start at c[i] if c[i] itself is in the class (U+3000 is both
// whitespace and in one of DeepSeek's classes).
func spaceOptPlus(in func(rune) bool) matcher {
	return func(c []rune, i int) int {
		if isSpace(c[i]) && i+1 < len(c) && in(c[i+1]) {
			return run(c, i+1, in) - i
		}
		return run(c, i, in) - i
	}
}

// matchThreeASCIIDigits is [0-9][0-9][0-9].
func matchThreeASCIIDigits(c []rune, i int) int {
	if i+3 <= len(c) {
		for _, r := range c[i : i+3] {
			if r < '0' || r > '9' {
				return 0
			}
		}
		return 3
	}
	return 0
}

// splitTrailingSpace implements \s+$ (DeepSeek LLM): without the multiline
// flag "$" is only the end of the chunk, so the one possible match is the
// run of whitespace that ends the chunk. Done as a whole-chunk splitter, not
// a matcher, so that a long run of spaces in the middle is not rescanned from
// every position.
func splitTrailingSpace(c []rune, out []int) []int {
	k := len(c)
	for k > 0 && isSpace(c[k-1]) {
		k--
	}
	if k > 0 {
		out = append(out, k)
	}
	if k < len(c) {
		out = append(out, len(c)-k)
	}
	return out
}

// runeClass is a character class given as sorted, non-overlapping ranges.
type runeClass []struct{ lo, hi rune }

func (rc runeClass) contains(r rune) bool {
	lo, hi := 0, len(rc)
	for lo < hi {
		m := (lo + hi) / 2
		switch {
		case r < rc[m].lo:
			hi = m
		case r > rc[m].hi:
			lo = m + 1
		default:
			return true
		}
	}
	return false
}

// isUpperish is llama.cpp's (?=[\p{L}])([^a-z]): a letter that is not an
// ASCII small letter. llama.cpp matches it on a copy of the text where every
// non-ASCII letter is one placeholder byte, so a non-ASCII letter counts as
// both "upper" and "lower" (isLowerish).
func isUpperish(r rune) bool { return isLetter(r) && (r < 'a' || r > 'z') }

// isLowerish is (?=[\p{L}])([^A-Z]): a letter that is not an ASCII capital.
func isLowerish(r rune) bool { return isLetter(r) && (r < 'A' || r > 'Z') }

// matchCasedWord is the two word alternatives of the Tekken and GPT-4o
// expressions, with C the optional contraction (GPT-4o only):
//
//	[^\r\n\p{L}\p{N}]?U*L+C?|[^\r\n\p{L}\p{N}]?U+L*C?
//
// where U is isUpperish and L isLowerish: capitals then small letters, the
// capitals giving back as few as needed for L+ to start ("XMLHttp" is
// "XMLHttp" as one word, "HelloWorld" is "Hello" then "World"), or capitals
// alone ("ABC").
func matchCasedWord(c []rune, i int, contraction bool) int {
	j := i
	if f := flags(c[i]); f&(fLetter|fNumber) == 0 && !isCRLF(c[i]) {
		j = i + 1 // the optional prefix; without it no letter can start here
		if j >= len(c) {
			return 0
		}
	}
	end := -1
	// U*L+ : U* greedy, giving back capitals until L+ can start.
	u := run(c, j, isUpperish)
	for k := u; k >= j; k-- {
		if k < len(c) && isLowerish(c[k]) {
			end = run(c, k, isLowerish)
			break
		}
	}
	// U+L* when U*L+ failed.
	if end < 0 && u > j {
		end = run(c, u, isLowerish)
	}
	if end < 0 {
		return 0
	}
	if contraction && end < len(c) {
		end += matchContraction(c, end, true)
	}
	return end - i
}

// matchTekken implements Mistral's Tekken pre-tokenizer regex as adapted by
// llama.cpp:
//
//	[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
func matchTekken(c []rune, i int) int { return matchCasedRest(c, i, 1, false) }

// matchGPT4o implements the GPT-4o / Llama 4 pre-tokenizer regex as adapted
// by llama.cpp:
//
//	[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
func matchGPT4o(c []rune, i int) int { return matchCasedRest(c, i, 3, true) }

func matchCasedRest(c []rune, i, maxDigits int, contraction bool) int {
	if n := matchCasedWord(c, i, contraction); n > 0 {
		return n
	}
	if isNumber(c[i]) {
		return min(run(c, i, isNumber)-i, maxDigits)
	}
	// ' ?[^\s\p{L}\p{N}]+[\r\n/]*'
	if n := optSpaceThen(c, i, isOther); n > 0 {
		return run(c, i+n, func(r rune) bool { return isCRLF(r) || r == '/' }) - i
	}
	e := run(c, i, isSpace)
	for k := e - 1; k >= i; k-- { // \s*[\r\n]+
		if isCRLF(c[k]) {
			return k + 1 - i
		}
	}
	if n := spaceRunNoLookahead(c, i); n > 0 { // \s+(?!\S)
		return n
	}
	return e - i // \s+
}

// isBloomWord is [^(\s|.,!?…。，、।۔،)]: anything but whitespace and these
// sentence punctuation marks (and the "(", "|", ")" that the expression's
// author meant as grouping but that are class members).
func isBloomWord(r rune) bool {
	switch r {
	case '(', '|', '.', ',', '!', '?', '…', '。', '，', '、', '।', '۔', '،', ')':
		return false
	}
	return !isSpace(r)
}

// matchBloom implements the BLOOM / Poro / GPT-3-Finnish / Viking word
// expression (quoted: it starts with a space)
//
//	" ?[^(\s|.,!?…。，、।۔،)]+"
func matchBloom(c []rune, i int) int { return optSpaceThen(c, i, isBloomWord) }
