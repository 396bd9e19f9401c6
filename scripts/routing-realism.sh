#!/usr/bin/env bash
# Issue 33 item 3: the trained model's routing on held-out text beside the real phone traces (data/route-traces) and
# a random-weight model of the same shape (bmoe-bench make-model), each measured by `bmoe-bench realism`.
#
#   scripts/routing-realism.sh OUT_DIR     (OUT_DIR is created; nothing else is written)
#
# Each model is given each committed held-out passage (harness/data/models/tiny/heldout-sample.prompts.jsonl: text
# the model never trained on) as its prompt, streamed with no cache, greedy, -n 64, recording every routing decision
# (--route-trace; one process per passage, merged into one trace with a turn per passage): prefill rows are the
# held-out text teacher-forced, decode rows what the model then wrote (<name>.txt). A second run per passage with
# --predict-prefetch and an 8 MiB cache records the early router's recall per layer (predict_agree_l<L> in the CSVs'
# summary lines) and its wasted reads.
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
merge() {  # route traces of one model, one per prompt -> one trace, each prompt its own turn (route_trace v2)
  "$repo/.venv/bin/python" - "$@" <<'PY'
import sys
out, ins = sys.argv[1], sys.argv[2:]
with open(out, "w") as w:
    for i, path in enumerate(ins):
        for line in open(path):
            if line.startswith("#") or line.startswith("turn,"):
                if i == 0:
                    w.write(line)
                continue
            w.write(f"{i}," + line.split(",", 1)[1])
PY
}
n_prompts=$("$repo/.venv/bin/python" -c "import sys; print(sum(1 for _ in open(sys.argv[1])) - 1)" "$prompts")
for m in trained:"$tiny/bmoe-tiny-Q4_K_M.gguf" random:"$random"; do
  name="${m%%:*}"; path="${m#*:}"
  [ -f "$out/$name.route.csv" ] && continue  # made by an earlier run of this script
  rm -f "$out/$name".*  # a half-made earlier attempt
  traces=()
  for i in $(seq 0 $((n_prompts - 1))); do
    text=$("$repo/.venv/bin/python" -c "import json,sys; print(json.loads(open(sys.argv[1]).readlines()[int(sys.argv[2]) + 1])['prompt'])" "$prompts" "$i")
    "$bmoe" -m "$path" --moe-stream --cache-mb 0 -t 2 -c 2048 -n 64 -p "$text" --route-trace "$out/$name.$i.route.csv" \
      --csv "$out/$name.$i.csv" >>"$out/$name.txt" 2>>"$out/$name.log"
    printf '\n\n' >>"$out/$name.txt"
    "$bmoe" -m "$path" --moe-stream --cache-mb 8 --predict-prefetch -t 2 -c 2048 -n 64 -p "$text" \
      --csv "$out/$name.predict.$i.csv" >/dev/null 2>>"$out/$name.predict.log"
    traces+=("$out/$name.$i.route.csv")
  done
  merge "$out/$name.route.csv" "${traces[@]}"
  rm -f "${traces[@]}"
done
"$bench" realism "$out/trained.route.csv" "$out/random.route.csv" "$repo/data/route-traces/qwen.route.csv" \
  "$repo/data/route-traces/gptoss.route.csv" --out "$out"
"$repo/.venv/bin/python" - "$out" <<'PY'
import sys
from pathlib import Path
from harness.replay.recall import markdown, recall_table
d = Path(sys.argv[1])
rows = [r for name in ("trained", "random") for r in recall_table(name, sorted(d.glob(f"{name}.predict.*.csv")), 4 / 32)]
(d / "recall.md").write_text(markdown(rows))
PY
rm -f "$random"  # 32 MiB, made again from its seed by the line above
