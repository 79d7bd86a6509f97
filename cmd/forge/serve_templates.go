package main

import (
	"fmt"
	"strings"

	"github.com/forge-llm/forge/pipeline/chat"
)

// splitTemplates sorts serve's --chat-template values: ID=NAME|FILE, where
// ID is one of the -m models' ids, sets that model's template; a value
// without such a prefix is every other model's (at most one). A template
// set twice for the same model is a usage error.
func splitTemplates(values []string, models []modelArg) (all string, per map[string]string, err error) {
	ids := map[string]bool{}
	for _, m := range models {
		ids[m.id] = true
	}
	for _, v := range values {
		if id, t, ok := strings.Cut(v, "="); ok && ids[id] {
			if t == "" {
				return "", nil, usageErrorf("--chat-template %q: no template after %s=", v, id)
			}
			if per == nil {
				per = map[string]string{}
			}
			if _, dup := per[id]; dup {
				return "", nil, usageErrorf("--chat-template: model %q given two templates", id)
			}
			per[id] = t
			continue
		}
		if all != "" {
			return "", nil, usageErrorf("--chat-template %q and %q: two templates for every model (ID=… sets one model's; the ids are the -m models')", all, v)
		}
		all = v
	}
	return all, per, nil
}

// loadModelTemplates reads each model's --chat-template.
func loadModelTemplates(per map[string]string) (map[string]*chat.Template, error) {
	out := map[string]*chat.Template{}
	for id, arg := range per {
		t, err := loadChatTemplate(arg)
		if err != nil {
			return nil, fmt.Errorf("model %q: %w", id, err)
		}
		out[id] = t
	}
	return out, nil
}
