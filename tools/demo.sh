#!/usr/bin/env bash
# The demo on the built-in default, needing nothing outside the repository: builds wren,
# synthesizes a tiny random-weight model with the bundled Qwen3 tokenizer (models/tiny, once),
# chats with it for a few turns, then measures its perplexity and speed. Random weights answer
# gibberish; the point is the whole path: tokenizer, chat template, state reuse across turns,
# sampling, prefill and decode.
# WREN_DEMO_MODEL=DIR puts the tiny model elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${WREN_DEMO_MODEL:-models/tiny}

tools/setup.sh --no-python
tools/build.sh
if [ ! -f "$model/config.json" ]; then
  echo "== synthesizing a tiny model into $model"
  build/wren synth --preset tiny --tokenizer data/tokenizers/qwen3 --out "$model"
fi

echo "== wren chat (three turns piped in; the summary lines show the reused state)"
printf '%s\n' "Hello! Who are you?" "/think off" "Name three colours." "/think on" \
  "Why is the sky blue?" | build/wren chat -m "$model" --max-tokens 32 --seed 1

echo "== wren perplexity"
build/wren perplexity -m "$model" --text-file README.md

echo "== wren bench"
build/wren bench -m "$model" --prefill 128,512 --decode 128,512
