package main

import (
	"os"

	"github.com/urfave/cli/v2"

	"github.com/forge-llm/forge/pipeline/constrain"
)

// constrainFlags are forge run's constrained-output flags, spelled as
// llama.cpp's (llama-cli --grammar, --grammar-file, -j, -jf).
func constrainFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "grammar", Usage: "constrain the output to a GBNF `GRAMMAR` (llama.cpp's syntax; the start rule is root)"},
		&cli.StringFlag{Name: "grammar-file", Usage: "constrain the output to the GBNF grammar in `FILE`"},
		&cli.StringFlag{Name: "json-schema", Aliases: []string{"j"}, Usage: "constrain the output to JSON valid under the JSON Schema `SCHEMA` ({} for any JSON value)"},
		&cli.StringFlag{Name: "json-schema-file", Aliases: []string{"jf"}, Usage: "constrain the output to the JSON Schema in `FILE`"},
	}
}

// grammarFlags compiles the one constraint flag given (nil: none). A
// grammar or schema that does not compile is a usage error naming the flag.
func grammarFlags(c *cli.Context) (*constrain.Grammar, error) {
	var set []string
	for _, f := range []string{"grammar", "grammar-file", "json-schema", "json-schema-file"} {
		if c.IsSet(f) {
			set = append(set, f)
		}
	}
	switch len(set) {
	case 0:
		return nil, nil
	case 1:
	default:
		return nil, usageErrorf("--%s and --%s: give one grammar or schema", set[0], set[1])
	}
	flag := set[0]
	src := c.String(flag)
	if flag == "grammar-file" || flag == "json-schema-file" {
		b, err := os.ReadFile(src)
		if err != nil {
			return nil, usageErrorf("--%s: %v", flag, err)
		}
		src = string(b)
	}
	var g *constrain.Grammar
	var err error
	if flag == "grammar" || flag == "grammar-file" {
		g, err = constrain.ParseGBNF(src)
	} else {
		g, err = constrain.JSONSchema([]byte(src))
	}
	if err != nil {
		return nil, usageErrorf("--%s: %v", flag, err)
	}
	return g, nil
}
