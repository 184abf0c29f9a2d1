#!/usr/bin/env python3
# Architecture guard rail (CI): every include and every CMake link of a library folder points down the
# layers (ALLOWED below); a back-pointing one fails with file:line. Runs in well under a second.
import os
import re
import sys

# What each library folder may include (itself, and everything below it):
#   kernels <- engine <- autograd <- models <- train <- tools;  autograd <- optim <- dist <- train;
#   text (plain C++ over strings and ids) <- train, tools.
ALLOWED = {
    "kernels": {"kernels"},
    "engine": {"engine", "kernels"},
    "autograd": {"autograd", "engine", "kernels"},
    "optim": {"optim", "autograd", "engine", "kernels"},
    "models": {"models", "autograd", "engine", "kernels"},
    "dist": {"dist", "optim", "autograd", "engine", "kernels"},
    "text": {"text"},
    "train": {"train", "models", "dist", "optim", "text", "autograd", "engine", "kernels"},
    "tools": {"tools", "train", "models", "dist", "optim", "text", "autograd", "engine", "kernels"},
}
# The documented exceptions, file by file (a new file that needs one must be added here, with why):
EXCEPTIONS = {
    # README "Layout": text is above engine, which it uses only for the GGUF reader (a .gguf file's
    # tokenizer.ggml.* metadata becomes a tokenizer), never its tensors.
    ("text/gguf_tokenizer.h", "engine/gguf.h"),
    ("text/gguf_tokenizer.cpp", "engine/status_macros.h"),
    # The SentencePiece ('llama') half of the same conversion, split out of gguf_tokenizer.cpp.
    ("text/gguf_tokenizer_internal.h", "engine/gguf.h"),
    ("text/gguf_tokenizer_spm.cpp", "engine/status_macros.h"),
    # The same exception for the chat template a .gguf file carries (tokenizer.chat_template).
    ("text/chat_template.cpp", "engine/gguf.h"),
    ("text/chat_template.cpp", "engine/status_macros.h"),
    # The one check of a --model path (empty, a Hugging Face id, a folder, a .gguf, a file of another
    # kind), shared by CausalLM::load and Tokenizer::load: plain file-system sniffing, no tensors.
    ("text/tokenizer_load.cpp", "engine/model_path.h"),
    # ToyLlama (the random-init stack of `loom demo` and the foundation tests) owns its optimizer.
    ("models/toy_llama.h", "optim/optimizer.h"),
    ("models/toy_llama.cpp", "optim/adamw.h"),
}
# The library targets each folder's CMakeLists.txt defines, and the folder a target belongs to.
TARGET_FOLDER = {"loom_" + f: f for f in ALLOWED}
TARGET_FOLDER.update({"loom_cli_args": "tools", "loom": "tools"})
SOURCE_EXT = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*["<]([^">]+)[">]')


def folder_of_include(path, inc):
    """The library folder an include names, or None for a system/third-party header."""
    if inc.startswith("../") or inc.startswith("./"):
        inc = os.path.normpath(os.path.join(os.path.dirname(path), inc))
    top = inc.split("/", 1)[0]
    if "/" in inc and top in ALLOWED:
        return top, inc
    if "/" not in inc and os.path.exists(os.path.join(os.path.dirname(path), inc)):
        return path.split("/", 1)[0], inc  # same-folder include
    return None, inc


def check_includes(root, errors):
    for folder in ALLOWED:
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for name in sorted(files):
                if not name.endswith(SOURCE_EXT):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE_RE.match(line)
                        if not m:
                            continue
                        target, inc = folder_of_include(rel, m.group(1))
                        if target is None or target in ALLOWED[folder] or (rel, inc) in EXCEPTIONS:
                            continue
                        errors.append(f"{rel}:{lineno}: {folder}/ includes \"{inc}\" from {target}/, a layer "
                                      f"it must not see (allowed: {', '.join(sorted(ALLOWED[folder]))}; "
                                      "ALLOWED in tools/check/check_layers.py)")


def check_cmake(root, errors):
    """Every loom_* library a folder links (PUBLIC, PRIVATE or INTERFACE) is one its layer may see; a
    PUBLIC link exposes that layer to every consumer, so it is checked the same way."""
    call_re = re.compile(r"target_link_libraries\s*\(([^)]*)\)", re.S)
    for folder in ALLOWED:
        path = os.path.join(folder, "CMakeLists.txt")
        try:
            text = open(os.path.join(root, path), encoding="utf-8").read()
        except FileNotFoundError:
            continue
        for m in call_re.finditer(text):
            body = re.sub(r"#[^\n]*", "", m.group(1))
            words = body.split()
            if not words or words[0] not in TARGET_FOLDER:
                continue
            lineno = text.count("\n", 0, m.start()) + 1
            owner = TARGET_FOLDER[words[0]]
            visibility = "PUBLIC"
            for w in words[1:]:
                if w in ("PUBLIC", "PRIVATE", "INTERFACE"):
                    visibility = w
                    continue
                dep = TARGET_FOLDER.get(w)
                if dep is None or dep in ALLOWED[owner]:
                    continue
                if any(r.startswith(owner + "/") and i.startswith(dep + "/") for r, i in EXCEPTIONS):
                    continue
                errors.append(f"{path}:{lineno}: {words[0]} links {w} ({visibility}), a layer {owner}/ must "
                              f"not see (allowed: {', '.join(sorted(ALLOWED[owner]))}; ALLOWED in tools/check/check_layers.py)")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    errors = []
    check_includes(root, errors)
    check_cmake(root, errors)
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        print(f"check_layers: {len(errors)} back-pointing include(s)/link(s)", file=sys.stderr)
        return 1
    print("check_layers: every include and library link follows the layers (tools/check/check_layers.py ALLOWED)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
