#!/bin/bash
# hook_cost.py for the implementation before (OLD, default /tmp/cache-old: see findings.md) and this checkout,
# one after the other per workload; CSV on stdout. MODEL: the generated qwen3-30b-a3b-shape model (header only).
M=${MODEL:-$HOME/.cache/bmoe/models/039a33ed8f0a282b/model.gguf}
OLD=${OLD:-/tmp/cache-old}
HERE=$(cd "$(dirname "$0")" && pwd)
NEW=$(cd "$HERE/../.." && pwd)
PY=${PY:-python}
P="lru lfu layer layer-lfu aged aged-decay aged-markov markov-duel"
echo "impl,round,workload,policy,hook_mgmt_wall_ms,hook_cpu_ms,cache_cpu_ms"
for w in qwen synth-top8; do
  for tree in "$OLD" "$NEW"; do
    lab=$([ "$tree" = "$OLD" ] && echo before || echo after)
    (cd "$tree" && PYTHONPATH="$tree" "$PY" -P "$HERE/hook_cost.py" "$M" $w $P) | tail -n +2 | sed "s/^/$lab,1,/"
  done
done
