#!/bin/bash
# usage: BASE=/tmp/base PY=/path/python scripts/mgmt_side_by_side.sh OUT 2 model.gguf small -- --moe-stream --cache-mb 80 -t 1 -n 16 -p "..."
# then: python scripts/mgmt_summary.py OUT
# mgmt wall per decode token, before (the BASE tree) / after with the Python lanes / after with the compiled lanes,
# side by side in one run, alternating per round. Args: OUTDIR ROUNDS MODEL TAG -- bmoe flags
OUT=$1; ROUNDS=$2; M=$3; TAG=$4; shift 5
BASE=${BASE:?set BASE to an extracted tree of the commit before (git archive REV harness data | tar -x -C DIR, plus its .so files and harness/engine/diag/mgmt_profile.py from here)}
HERE=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p $OUT
PY=${PY:-$HERE/.venv/bin/python}
for round in $(seq 1 $ROUNDS); do
  if [ $((round % 2)) = 1 ]; then ORDER="before python c"; else ORDER="c python before"; fi
  for v in $ORDER; do
    case $v in
      before) ROOT=$BASE; E="";;
      python) ROOT=$HERE; E="BMOE_PURE_PYTHON_LANES=1";;
      c) ROOT=$HERE; E="BMOE_PURE_PYTHON_LANES=0";;
    esac
    (cd $ROOT && env $E PYTHONPATH=$ROOT $PY -m harness.engine.diag.mgmt_profile $OUT/$TAG-$v-$round.json -- -m $M "$@" \
      > $OUT/$TAG-$v-$round.out 2> $OUT/$TAG-$v-$round.err)
    echo "$TAG $v round $round: $(grep -a '^mgmt' $OUT/$TAG-$v-$round.err) (load $(cut -d' ' -f1 /proc/loadavg))"
  done
done
