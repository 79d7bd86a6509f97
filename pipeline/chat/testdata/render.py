#!/usr/bin/env python3
"""Renders every template in templates/ with every conversation in
conversations.json the way Hugging Face's apply_chat_template does
(transformers' utils/chat_template_utils.py: a sandboxed Jinja2
environment with trim_blocks and lstrip_blocks, the loopcontrols
extension, a {% generation %} tag that renders its body, tojson without
ASCII escaping, raise_exception and strftime_now), and writes the results
to golden/<template>/<conversation>.txt, or .err with the exception's
message when the template refuses the conversation.

strftime_now is pinned to 2026-11-25 so the dated templates (Llama 3.2)
render the same every day; the Go test pins the same date.

Run from this directory with Python's Jinja2 (3.1.x):
    python3 render.py
"""
import datetime
import json
import os
import shutil

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

NOW = datetime.datetime(2026, 11, 25, 17, 30, 0)
BOS = {"default": "<s>"}
EOS = {"default": "</s>"}


class Generation(Extension):
    """{% generation %}…{% endgeneration %}: HF marks assistant tokens with
    it; for rendering it is its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def strftime_now(fmt):
    return NOW.strftime(fmt)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "conversations.json"), encoding="utf-8") as f:
        spec = json.load(f)
    out = os.path.join(here, "golden")
    shutil.rmtree(out, ignore_errors=True)
    env = environment()
    for fn in sorted(os.listdir(os.path.join(here, "templates"))):
        if not fn.endswith(".jinja"):
            continue
        name = fn[: -len(".jinja")]
        with open(os.path.join(here, "templates", fn), encoding="utf-8") as f:
            tmpl = env.from_string(f.read())
        os.makedirs(os.path.join(out, name))
        for conv, c in sorted(spec["conversations"].items()):
            ctx = {
                "messages": c["messages"],
                "add_generation_prompt": True,
                "bos_token": "<s>",
                "eos_token": "</s>",
            }
            if c.get("tools"):
                ctx["tools"] = spec["tools"]
            try:
                text, ext = tmpl.render(**ctx), ".txt"
            except jinja2.exceptions.TemplateError as e:
                text, ext = str(e) + "\n", ".err"
            with open(os.path.join(out, name, conv + ext), "w", encoding="utf-8", newline="") as f:
                f.write(text)


if __name__ == "__main__":
    main()
