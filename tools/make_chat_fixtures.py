#!/usr/bin/env python3
# Renders test conversations with the official chat templates (tests/fixtures/chat/*.jinja) through
# transformers' own renderer (the one apply_chat_template(tokenize=False) calls) and writes
# tests/fixtures/chat/cases.json: the expected text and the byte spans the loss is taken on.
#
#   pip install transformers jinja2      (no torch needed)
#   python3 tools/make_chat_fixtures.py
#
# Templates (copied from each model's tokenizer_config.json "chat_template"):
#   qwen2_5.jinja   Qwen/Qwen2.5-*-Instruct   ("chatml": default system prompt when none is given)
#   llama3_1.jinja  meta-llama/Llama-3.1-*-Instruct (system header with "Cutting Knowledge Date:
#                   December 2023" and the template's fixed default "Today Date: 26 Jul 2024")
#   gemma3.jinja    google/gemma-3-*-it (a system message is folded into the first user turn;
#                   with no system message it renders exactly as gemma-2-it's template does)
#
# Train spans are derived here independently of the C++ code: an assistant message i starts where
# render(messages[:i], add_generation_prompt=True) ends (which must be a prefix of the full text),
# and runs over its content (as the template prints it: trimmed for Llama/Gemma) plus the
# end-of-turn marker. Offsets are in UTF-8 bytes.
import json
import os

from transformers.utils.chat_template_utils import render_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
CHAT_DIR = os.path.join(HERE, "..", "tests", "fixtures", "chat")

TEMPLATES = {
    # name in Loom: (file, special tokens passed as apply_chat_template does, end-of-turn marker,
    #                whether assistant content is trimmed)
    "chatml": ("qwen2_5.jinja", {"bos_token": None, "eos_token": "<|im_end|>"}, "<|im_end|>", False),
    "llama3": ("llama3_1.jinja", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, "<|eot_id|>", True),
    "gemma": ("gemma3.jinja", {"bos_token": "<bos>", "eos_token": "<eos>"}, "<end_of_turn>", True),
}

S = "system"
U = "user"
A = "assistant"


def m(role, content):
    return {"role": role, "content": content}


CONVERSATIONS = [
    ("single_turn_system", [m(S, "You are a terse assistant."), m(U, "What is 2+2?"), m(A, "4")], False),
    ("single_turn_no_system", [m(U, "Hello!"), m(A, "Hi, how can I help?")], False),
    ("multi_turn", [m(S, "Answer in French."), m(U, "Hello"), m(A, "Bonjour"), m(U, "Thanks"),
                    m(A, "De rien !")], False),
    ("generation_prompt", [m(S, "Be brief."), m(U, "Name a colour.")], True),
    ("generation_prompt_no_system", [m(U, "Name a colour."), m(A, "Blue."), m(U, "Another?")], True),
    ("unicode", [m(U, "Grüße, 你好, emoji 🌍 and ∑x²"), m(A, "Ça va — très bien 😀")], False),
    ("whitespace_edges", [m(S, "  padded system \n"), m(U, "\n  spaced user  "),
                          m(A, "\u00a0 nbsp and ideographic space\u3000\n")], False),
    ("empty_content", [m(U, ""), m(A, "")], False),
    ("whitespace_only_assistant", [m(U, "Say nothing."), m(A, " \n\t ")], False),
    ("multiline", [m(U, "Write code:\n```\nx = 1\n```"), m(A, "Here:\n\n```python\nprint(1)\n```\n")], False),
    ("user_only", [m(U, "Just a question")], False),
    ("system_only", [m(S, "Only a system prompt")], False),
    ("ends_with_assistant_generation_prompt", [m(U, "Hi"), m(A, "Hello")], True),
    ("special_looking_text", [m(U, "literal <|im_start|> and <start_of_turn> text"), m(A, "ok <b>")], False),
    # Gemma's template raises (roles must alternate); Qwen and Llama render it.
    ("system_not_first", [m(U, "Hi"), m(S, "Late system note"), m(A, "Hello")], False),
    ("two_users_in_a_row", [m(U, "one"), m(U, "two"), m(A, "three")], False),
]


def render(template, tokens, messages, add_generation_prompt):
    return render_jinja_template(conversations=[messages], chat_template=template,
                                 add_generation_prompt=add_generation_prompt, **tokens)[0][0]


def spans_for(template, tokens, marker, trims, messages, text):
    spans = []
    for i, msg in enumerate(messages):
        if msg["role"] != A:
            continue
        prefix = render(template, tokens, messages[:i], True)
        assert text.startswith(prefix), (prefix, text)
        content = msg["content"].strip() if trims else msg["content"]
        begin = len(prefix)
        end = begin + len(content) + len(marker)
        assert text[begin:end] == content + marker, (text[begin:end], content + marker)
        spans.append([len(text[:begin].encode("utf-8")), len(text[:end].encode("utf-8"))])
    return spans


def main():
    cases = []
    for name, (path, tokens, marker, trims) in TEMPLATES.items():
        with open(os.path.join(CHAT_DIR, path), encoding="utf-8") as f:
            template = f.read()
        for conv_name, messages, agp in CONVERSATIONS:
            case = {"template": name, "name": conv_name, "messages": messages, "add_generation_prompt": agp}
            try:
                text = render(template, tokens, messages, agp)
            except Exception as e:  # the template's raise_exception
                case["error"] = str(e)
            else:
                case["text"] = text
                case["train_spans"] = spans_for(template, tokens, marker, trims, messages, text)
            cases.append(case)
    out = os.path.join(CHAT_DIR, "cases.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {os.path.normpath(out)}")


if __name__ == "__main__":
    main()
