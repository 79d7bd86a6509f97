package constrain_test

import (
	"fmt"

	"github.com/forge-llm/forge/pipeline/constrain"
)

// A tool call in a chat format's own wrapping, its arguments held to the
// tool's JSON Schema: several schemas go into one Converter, and the root
// rule (written by the caller, who knows the format) refers to them.
func ExampleConverter() {
	weather := []byte(`{"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["celsius","fahrenheit"]}},"required":["city"],"additionalProperties":false}`)
	search := []byte(`{"type":"object","properties":{"query":{"type":"string"}},"required":["query"]}`)
	c := constrain.NewConverter()
	wArgs, err := c.AddSchema("get-weather-args", weather)
	if err != nil {
		panic(err)
	}
	sArgs, err := c.AddSchema("search-args", search)
	if err != nil {
		panic(err)
	}
	g, err := c.Grammar(`root ::= "<tool_call>" ( weather | search ) "</tool_call>"
weather ::= "{\"name\": \"get_weather\", \"arguments\": " ` + wArgs + ` "}"
search ::= "{\"name\": " ` + constrain.Quote(`"search"`) + ` ", \"arguments\": " ` + sArgs + ` "}"`)
	if err != nil {
		panic(err)
	}
	fmt.Println(g.Accepts(`<tool_call>{"name": "get_weather", "arguments": {"city":"Paris","unit":"celsius"}}</tool_call>`))
	fmt.Println(g.Accepts(`<tool_call>{"name": "search", "arguments": {"query":"forge"}}</tool_call>`))
	fmt.Println(g.Accepts(`<tool_call>{"name": "get_weather", "arguments": {"unit":"celsius"}}</tool_call>`)) // city is required
	// Output:
	// true
	// true
	// false
}

// A Matcher follows one sequence: Allowed is the mask for the next token
// (computed in the background since the last Accept), Accept feeds the
// token that was picked.
func ExampleGrammar_NewMatcher() {
	g, err := constrain.ParseGBNF(`root ::= "yes" | "no"`)
	if err != nil {
		panic(err)
	}
	// Token 0 ends generation; the others are the bytes they print.
	v := constrain.NewVocab([][]byte{nil, []byte("y"), []byte("yes"), []byte("no"), []byte("maybe")}, []int32{0})
	m := g.NewMatcher(v, 0)
	defer m.Close()
	show := func() {
		mask, _ := m.Allowed()
		var ids []int
		for id := range v.Size() {
			if mask[0]&(1<<id) != 0 {
				ids = append(ids, id)
			}
		}
		fmt.Println(ids)
	}
	show() // y, yes, no
	if err := m.Accept(2); err != nil {
		panic(err)
	}
	show() // only the end
	// Output:
	// [1 2 3]
	// [0]
}
