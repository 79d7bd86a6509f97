package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/pipeline/tokenizer"
)

func init() { commands = append(commands, tokenizeCommand()) }

// tokenizeCommand is `forge tokenize -m FILE`: the ids of the text on stdin,
// exactly as the tokenizer makes them, for comparing with llama.cpp's
// llama-tokenize. Nothing is added or parsed unless asked: the text is raw.
func tokenizeCommand() *cli.Command {
	return &cli.Command{
		Name:  "tokenize",
		Usage: "print the token ids of the text on stdin, space-separated on one line",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "model", Aliases: []string{"m"}, Required: true, Usage: "GGUF `FILE` or store name (name:tag, org/name[:QUANT]) whose tokenizer to use"},
			&cli.StringFlag{Name: "prompt", Aliases: []string{"p"}, Usage: "tokenize `TEXT` instead of reading stdin"},
			&cli.BoolFlag{Name: "bos", Usage: "put the BOS token first"},
			&cli.BoolFlag{Name: "eos", Usage: "put the EOS token last"},
			&cli.BoolFlag{Name: "parse-special", Usage: "turn the text of control tokens (<s>, <|im_end|>, …) into those tokens"},
			&cli.BoolFlag{Name: "pieces", Usage: "after the ids, print one line per token: id, tab, its text quoted"},
		},
		Action: runTokenize,
	}
}

func runTokenize(c *cli.Context) error {
	path, err := resolveModel(c.String("model"))
	if err != nil {
		return fmt.Errorf("tokenize: %w", err)
	}
	f, err := gguf.Open(path)
	if err != nil {
		return err
	}
	tok, err := tokenizer.FromFile(f)
	f.Close()
	if err != nil {
		return err
	}

	text := c.String("prompt")
	if !c.IsSet("prompt") {
		in := c.App.Reader
		if in == nil {
			return fmt.Errorf("tokenize: no stdin")
		}
		b, err := io.ReadAll(in)
		if err != nil {
			return fmt.Errorf("tokenize: reading stdin: %w", err)
		}
		text = string(b)
	}

	ids, err := tok.Encode(text, tokenizer.EncodeOptions{
		AddBOS:       c.Bool("bos"),
		AddEOS:       c.Bool("eos"),
		ParseSpecial: c.Bool("parse-special"),
	})
	if err != nil {
		return err
	}
	var sb strings.Builder
	for i, id := range ids {
		if i > 0 {
			sb.WriteByte(' ')
		}
		sb.WriteString(strconv.Itoa(int(id)))
	}
	sb.WriteByte('\n')
	if c.Bool("pieces") {
		for _, id := range ids {
			fmt.Fprintf(&sb, "%d\t%q\n", id, tok.Piece(id))
		}
	}
	_, err = io.WriteString(c.App.Writer, sb.String())
	return err
}
