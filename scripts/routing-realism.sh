#!/usr/bin/env bash
# Issue 33 item 3: the trained model's routing on held-out text beside the real phone traces (data/route-traces) and
# a random-weight model of the same shape (bmoe-bench make-model), each measured by `bmoe-bench realism`.
#
#   scripts/routing-realism.sh OUT_DIR     (OUT_DIR is created; nothing else is written)
#
# Each model answers the committed held-out prompts (harness/data/models/tiny/heldout-sample.prompts.jsonl: text the
# model never trained on) streamed with no cache, greedy, -n 64 per prompt, recording every routing decision
# (--route-trace): prefill rows are the held-out text teacher-forced, decode rows what the model then wrote. A
# second pass with --predict-prefetch records the early router's recall per layer (predict_agree_l<L> in the CSV).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
[ $# -eq 1 ] || { echo "usage: scripts/routing-realism.sh OUT_DIR" >&2; exit 2; }
out="$1"; mkdir -p "$out"
bmoe="$repo/.venv/bin/bmoe"; bench="$repo/.venv/bin/bmoe-bench"
tiny="$repo/harness/data/models/tiny"
prompts="$tiny/heldout-sample.prompts.jsonl"
random="$out/random-tiny-shape.gguf"
[ -f "$random" ] || "$bench" make-model "$random" --arch qwen3moe --layers 6 --experts 32 --top-k 4 --embd 256 \
  --expert-ff 128 --heads 4 --heads-kv 2 --head-dim 64 --vocab 4096 --expert-type q8_0 --seed 1 >&2
for m in trained:"$tiny/bmoe-tiny-Q4_K_M.gguf" random:"$random"; do
  name="${m%%:*}"; path="${m#*:}"
  "$bmoe" -m "$path" --moe-stream --cache-mb 0 -t 2 -c 1024 -n 64 --prompts-file "$prompts" \
    --replies "$out/$name.replies.jsonl" --route-trace "$out/$name.route.csv" --csv "$out/$name.csv" \
    >/dev/null 2>"$out/$name.log"
  "$bmoe" -m "$path" --moe-stream --cache-mb 8 --predict-prefetch -t 2 -c 1024 -n 64 --prompts-file "$prompts" \
    --csv "$out/$name.predict.csv" >/dev/null 2>"$out/$name.predict.log"
done
"$bench" realism "$out/trained.route.csv" "$out/random.route.csv" "$repo/data/route-traces/qwen.route.csv" \
  "$repo/data/route-traces/gptoss.route.csv" --out "$out"
rm -f "$random"  # 32 MiB, made again from its seed by the line above
