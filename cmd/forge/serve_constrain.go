package main

import (
	"encoding/json"

	"github.com/forge-llm/forge/pipeline/constrain"
)

// Constrained output on the HTTP APIs:
//
//   - OpenAI's response_format: {"type": "text"}, {"type": "json_object"}
//     (any JSON object; llama.cpp's "schema" beside it constrains to that
//     schema), {"type": "json_schema", "json_schema": {"name", "schema",
//     "strict"}};
//   - llama.cpp's grammar (GBNF text) and json_schema (a schema) fields,
//     on the same routes;
//   - Ollama's format: "json" or a schema.
//
// At most one of them per request. The output is held to the grammar
// whatever "strict" says (forge has no looser mode).

// openAIGrammar reads the constraint fields of an OpenAI-style request.
func openAIGrammar(responseFormat json.RawMessage, grammar string, jsonSchema json.RawMessage) (*constrain.Grammar, error) {
	var g *constrain.Grammar
	n := 0
	if isSet(responseFormat) {
		var rf struct {
			Type       string          `json:"type"`
			Schema     json.RawMessage `json:"schema"`
			JSONSchema *struct {
				Name   string          `json:"name"`
				Schema json.RawMessage `json:"schema"`
				Strict *bool           `json:"strict"`
			} `json:"json_schema"`
		}
		if err := json.Unmarshal(responseFormat, &rf); err != nil {
			return nil, badRequest("response_format must be an object with a type")
		}
		switch rf.Type {
		case "text", "":
		case "json_object":
			if isSet(rf.Schema) {
				return schemaGrammar("response_format.schema", rf.Schema)
			}
			g, n = constrain.JSONObject(), n+1
		case "json_schema":
			if rf.JSONSchema == nil || !isSet(rf.JSONSchema.Schema) {
				return nil, badRequest("response_format.json_schema.schema is required for type json_schema")
			}
			var err error
			if g, err = schemaGrammar("response_format.json_schema.schema", rf.JSONSchema.Schema); err != nil {
				return nil, err
			}
			n++
		default:
			return nil, badRequest("response_format.type %q is not text, json_object or json_schema", rf.Type)
		}
	}
	if grammar != "" {
		var err error
		if g, err = constrain.ParseGBNF(grammar); err != nil {
			return nil, badRequest("grammar: %v", err)
		}
		n++
	}
	if isSet(jsonSchema) {
		var err error
		if g, err = schemaGrammar("json_schema", jsonSchema); err != nil {
			return nil, err
		}
		n++
	}
	if n > 1 {
		return nil, badRequest("give one of response_format (json_object or json_schema), grammar and json_schema")
	}
	return g, nil
}

// ollamaGrammar reads Ollama's format: "json" or a JSON Schema.
func ollamaGrammar(format json.RawMessage) (*constrain.Grammar, error) {
	if !isSet(format) {
		return nil, nil
	}
	var s string
	if err := json.Unmarshal(format, &s); err == nil {
		switch s {
		case "":
			return nil, nil
		case "json":
			return constrain.JSONObject(), nil
		}
		return nil, badRequest("format %q is not \"json\" or a JSON schema", s)
	}
	return schemaGrammar("format", format)
}

func isSet(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

// schemaGrammar compiles a schema a client sent (a 400 naming the field
// when it is not one forge can enforce).
func schemaGrammar(field string, schema json.RawMessage) (*constrain.Grammar, error) {
	g, err := constrain.JSONSchema(schema)
	if err != nil {
		return nil, badRequest("%s: %v", field, err)
	}
	return g, nil
}

// checkConstrained refuses what a constrained request cannot do.
func checkConstrained(g *constrain.Grammar, ignoreEOS bool) error {
	if g != nil && ignoreEOS {
		return badRequest("ignore_eos cannot be combined with a grammar, json_schema or response_format (a complete output ends the generation)")
	}
	return nil
}

// constrainMetrics writes the constrained-decoding counters of the
// process: masks handed to the samplers, vocabulary walks, and the time
// spent computing masks (in the background) and waiting for them (in the
// step loop: what constrained output costs the decode).
func constrainMetrics(p promWriter) {
	st := constrain.ReadStats()
	p.family("forge_constrain_masks_total", "counter", "Token masks handed to constrained sequences.")
	p.sample("forge_constrain_masks_total", float64(st.Masks))
	p.family("forge_constrain_walks_total", "counter", "Vocabulary walks for masks not found in a grammar's cache.")
	p.sample("forge_constrain_walks_total", float64(st.Walks))
	p.family("forge_constrain_compute_seconds_total", "counter", "Time spent computing masks, overlapping the model's steps.")
	p.sample("forge_constrain_compute_seconds_total", st.Compute.Seconds())
	p.family("forge_constrain_blocked_seconds_total", "counter", "Time the step loop waited for a mask.")
	p.sample("forge_constrain_blocked_seconds_total", st.Blocked.Seconds())
}
