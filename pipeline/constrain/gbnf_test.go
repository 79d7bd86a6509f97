package constrain

import (
	"errors"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

const arithmetic = `# integer arithmetic
root ::= expr
expr ::= term ( ( "+" | "-" ) term )*
term ::= factor ( ( "*" | "/" ) factor )*
factor ::= [0-9]+ | "(" expr ")" | "-" factor
`

const list = `root ::= item+
item ::= "- " [^\n]{1,20} "\n"
`

// jsonGBNF is a JSON grammar written the way llama.cpp's examples write
// theirs (multi-line rules, groups spanning lines).
const jsonGBNF = `root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4})
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

ws ::= | " " | "\n" [ \t]{0,20}
`

func TestGBNFAccepts(t *testing.T) {
	for _, tc := range []struct {
		grammar string
		yes     []string
		no      []string
	}{
		{arithmetic, []string{"1", "1+2*3", "(1+2)*-3", "((4))/2-7"}, []string{"", "1+", "(1", "1++2", "a", "1 + 2"}},
		{list, []string{"- milk\n", "- milk\n- eggs and ham\n"}, []string{"", "- \n", "- milk", "* milk\n", "- " + strings.Repeat("x", 21) + "\n"}},
		{jsonGBNF, []string{`{}`, `{"a": 1}`, `{"a":[1,2,{"b":null}],"c":"\u00e9\n"}`, "{\n  \"k\": true }"}, []string{`[]`, `{"a"}`, `{"a":01x}`, `{"a":"` + "\x01" + `"}`}},
		{`root ::= "a"{2,3} "b"? [xyz]{2}`, []string{"aaxx", "aaabyz", "aabzz"}, []string{"axx", "aaaaxx", "aabx"}},
		{`root ::= "héllo" | [α-ω]+ | "😀" .`, []string{"héllo", "αβγ", "😀x", "😀é"}, []string{"hello", "😀", "αA"}},
		{`root ::= [^a-z]`, []string{"A", "é", "😀"}, []string{"a", "q", ""}},
		{"root ::= \"\\x41\\u00e9\\U0001F600\" [\\t\\n]", []string{"Aé😀\t", "Aé😀\n"}, []string{"Aé😀 "}},
	} {
		g, err := ParseGBNF(tc.grammar)
		if err != nil {
			t.Fatalf("%q: %v", tc.grammar, err)
		}
		for _, s := range tc.yes {
			if !g.Accepts(s) {
				t.Errorf("%q should accept %q", tc.grammar, s)
			}
		}
		for _, s := range tc.no {
			if g.Accepts(s) {
				t.Errorf("%q should reject %q", tc.grammar, s)
			}
		}
	}
}

func TestGBNFErrors(t *testing.T) {
	for _, src := range []string{
		`root ::= root "a"`,                         // left recursion
		"root ::= a\na ::= b? a \"x\"\nb ::= \"y\"", // left recursion through a nullable rule
		`root ::= missing`,                          // undefined
		`root ::= "abc`,                             // unterminated string
		`root ::= [a-`,                              // unterminated class
		`root ::= [z-a]`,                            // reversed range
		`root ::= "a"{3,2}`,                         // reversed repetition
		`root ::= "a"{99999}`,                       // too many
		`root ::= * "a"`,                            // nothing to repeat
		`other ::= "a"`,                             // no root
		"root ::= \"a\"\nroot ::= \"b\"",            // defined twice
		`root ::= ("a"`,                             // unclosed group
	} {
		if _, err := ParseGBNF(src); err == nil {
			t.Errorf("%q: no error", src)
		}
	}
}

func TestPatterns(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		samples int
	}{
		{`^[A-Z]{3}$`, 10}, {`^\d{3}-\d{4}$`, 10}, {`^(foo|bar)+baz?$`, 10}, {`[a-f0-9]{8}`, 10},
		{`^\w+@\w+\.com$`, 10}, {`^[^,]{1,5}$`, 10}, {`^a.c$`, 10}, {`^\x41é[\s]?$`, 5},
	} {
		e, err := regexToGBNF(tc.pattern)
		if err != nil {
			t.Fatalf("%q: %v", tc.pattern, err)
		}
		g, err := ParseGBNF("root ::= " + e)
		if err != nil {
			t.Fatalf("%q → %s: %v", tc.pattern, e, err)
		}
		re := regexp.MustCompile(tc.pattern)
		rng := rand.New(rand.NewPCG(2, 3))
		for range tc.samples {
			out := walk(t, g, testVocab(), rng, 80)
			if !re.MatchString(out) {
				t.Errorf("%q: %q does not match", tc.pattern, out)
			}
		}
	}
	for _, bad := range []string{`(?=a)b`, `(a)\1`, `\bword`, `[`, `a{2`, `*a`} {
		if _, err := regexToGBNF(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	if _, err := regexToGBNF(`(?=a)`); !errors.Is(err, ErrUnsupported) {
		t.Errorf("lookahead: %v, want ErrUnsupported", err)
	}
}
