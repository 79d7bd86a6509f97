package chat

import "encoding/json"

// Tool is a function the model may call, as OpenAI's tools entries and
// Ollama's tools describe it.
type Tool struct {
	Type     string   `json:"type"` // "function"
	Function Function `json:"function"`
}

// Function is a tool's name, description and JSON Schema of its arguments.
type Function struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// ToolCall is a call the model made (OpenAI's tool_calls entries).
type ToolCall struct {
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"` // "function"
	Function FunctionCall `json:"function"`
}

// FunctionCall names the function called and its arguments, a JSON object
// as text (OpenAI's shape; Ollama's is the object itself).
type FunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}
