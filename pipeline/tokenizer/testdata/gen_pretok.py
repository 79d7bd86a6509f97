#!/usr/bin/env python3
"""Writes pretok_golden.json: how each pre-tokenizer family splits a set of
tricky and random strings, computed with a real backtracking regex engine
(the `regex` module, which has lookahead and Unicode classes) running the
expressions of llama.cpp's llama-vocab.cpp in the same way as llama.cpp's
unicode_regex_split: each expression in turn cuts every piece the previous
one made; the text between matches stays a piece of its own.

The Go scanners in ../scanners.go are tested against this file. Rerun with
`python3 gen_pretok.py > pretok_golden.json` (deterministic: fixed seed).
"""
import json
import random
import regex

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
TEKKEN = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
CONTR = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
GPT4O = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + CONTR +
         r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + CONTR +
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"
QWEN2 = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def rng(spec):
    """Code point ranges "41-5A B5 ..." as a regex bracket body."""
    out = []
    for t in spec.split():
        a, _, b = t.partition("-")
        b = b or a
        out.append("%s-%s" % (regex.escape(chr(int(a, 16))), regex.escape(chr(int(b, 16)))))
    return "".join(out)


DS_LETTERS = rng("""41-5A 61-7A B5 C0-D6 D8-F6 F8-1BA 1BC-1BF 1C4-293 295-2AF 370-373 376-377
37B-37D 37F 386 388-38A 38C 38E-3A1 3A3-3F5 3F7-481 48A-52F 531-556 10A0-10C5 13A0-13F5
13F8-13FD 1C90-1CBA 1CBD-1CBF 1D00-1D2B 1D6B-1D77 1D79-1D9A 1E00-1F15 1F18-1F1D 1F20-1F45
1F48-1F4D 1F50-1F57 1F59 1F5B 1F5D 1F5F-1F7D 1F80-1FB4 1FB6-1FBC 1FBE 1FC2-1FC4 1FC6-1FCC
1FD0-1FD3 1FD6-1FDB 1FE0-1FEC 1FF2-1FF4 1FF6-1FFC 2102 2107 210A-2113 2115 2119-211D 2124
2126 2128 212A-212D 212F-2134 2139 213C-213F 2145-2149 214E 2183-2184 2C00-2C7B 2C7E-2CE4
2CEB-2CEE 2CF2-2CF3 A640-A66D A680-A69B A722-A76F A771-A787 A78B-A78E AB70-ABBF FB00-FB06
FB13-FB17 FF21-FF3A FF41-FF5A 10400-1044F 104B0-104D3 104D8-104FB 10C80-10CB2 10CC0-10CF2
118A0-118DF 1E900-1E943""")

FAMILIES = {
    "default": [r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
    "gpt-2": [GPT2],
    "llama-bpe": [LLAMA3],
    "qwen2": [QWEN2],
    "starcoder": [r"\p{N}", GPT2],
    "falcon": [r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
    "tekken": [TEKKEN],
    "gpt-4o": [GPT4O],
    "bloom": [BLOOM],
    "viking": [BLOOM, r"\p{N}"],
    "deepseek-llm": [
        r"[\r\n]",
        r"\s?[" + DS_LETTERS + r"]+",
        r"\s?[" + rng("21-2F 3A-7E FF01-FF0F FF1A-FF5E 2018-201F 3000-3002") + "]+",
        r"\s+$",
        "[" + rng("4E00-9FA5 800-4E00 AC00-D7FF") + "]+",
        r"\p{N}+",
    ],
    "deepseek-coder": [
        r"[\r\n]",
        r"\s?\p{L}+",
        r"\s?\p{P}+",
        "[" + rng("4E00-9FA5 800-4E00 AC00-D7FF") + "]+",
        r"\p{N}",
    ],
}


def split(exprs, text):
    pieces = [text]
    for e in exprs:
        rx = regex.compile(e)
        nxt = []
        for p in pieces:
            last = 0
            for m in rx.finditer(p):
                if m.start() > last:
                    nxt.append(p[last:m.start()])
                nxt.append(m.group())
                last = m.end()
            if last < len(p):
                nxt.append(p[last:])
        pieces = nxt
    return pieces


TRICKY = [
    "Hello world", " Hello  world ", "I've been 'told he's there, 'RE you sure? 'M not 'Ll 'd",
    "don't we'll they're", "3 33 333 3333 33333 1234567", "3.14 3..3 3...3 12,345",
    "!!!!!! ?????? ...... ''''''```````\"\"\"\"", "a\nb\n\nc\r\n\r\nd", "   \n\n  x", "\t\tx \t y",
    "x   ", "   ", "\n", " \n ", "Привет мир", "日本語のテキスト。次", "한국어 텍스트", "Ελληνικά ΩK",
    "مرحبا ٣٤٥", "²³ ½ Ⅻ ①②", "café naïve e\u0301", "$100 + 20 = <tag> ^~|`", "emoji 😀🤖 ok",
    "\u00a0nbsp\u3000ideographic\u2009thin", "ﬁ ｆｕｌｌ！（ｗｉｄｅ）", "a‘b’c “q”", "x\u3000\u3000y",
    "ǅemal ʰa", "\x00\x07 ctrl", "line one\n    indented\n\ttab", "'s", "'", "'S'T'M'D",
    "HelloWorld XMLHttpRequest ABC camelCase I'M We'LL", "path/to/file.go\n//comment/\n", "Ça va? ÀÉb ÉCOLE",
    "Hello, world! (test) a|b … done。 ok，yes", "end।x ۔y ،z",
]

ATOMS = [
    "a", "b", "Z", "hello", "é", "ß", "ж", "Ж", "中", "文", "ア", "가", "ǅ", "ʰ", "א", "µ", "ſ",
    "\u212a", "\u2126", "0", "1", "9", "12", "345", "6789", "٣", "²", "½", "Ⅻ", "①", "!", ".", ",",
    "'", "\"", "-", "_", "(", ")", "[", "{", "?", "@", "#", "%", "&", "*", "/", "\\", ":", ";",
    "¡", "«", "—", "。", "、", "！", "‘", "’", "“", "$", "+", "<", "=", ">", "^", "`", "|", "~",
    "€", "©", "😀", "\u0301", " ", " ", " ", "  ", "   ", "\t", "\n", "\r", "\r\n", "\n\n",
    "\u00a0", "\u3000", "\u2009", "\v", "\f", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S",
    "'RE", "'Ll", "\x00", "ｆ", "（",
    "HelloWorld", "XMLHttp", "ABC", "camelCase", "ÀB", "ÉCOLE", "École", "ǅz", "a/b", "//", "…", "।", "،",
]


def main():
    rnd = random.Random(4)
    inputs = list(TRICKY)
    for _ in range(300):
        inputs.append("".join(rnd.choice(ATOMS) for _ in range(rnd.randint(1, 24))))
    # One case per line, so that a change shows as a readable diff.
    fams = []
    for name, ex in FAMILIES.items():
        cases = ",\n".join(json.dumps({"text": t, "words": split(ex, t)}, ensure_ascii=False) for t in inputs)
        fams.append("%s: [\n%s\n]" % (json.dumps(name), cases))
    print("{\n" + ",\n".join(fams) + "\n}")


main()
