#!/bin/sh
# Reproduces results.jsonl in this folder (from the repository root, the project's venv active). Each line: one
# campaign on simulated devices (`python -m harness.campaigns.fleet.bench_sched --help` says what it measures); findings.md reads
# them. About 15 minutes on 2 idle cores.
set -e
out=bench-data/2026-12-03-scheduler/results.jsonl
b() { nice -n 19 ionice -c3 python -m harness.campaigns.fleet.bench_sched --out "$out" "$@"; }
# the one-target runner, no engine time: the harness's own time per run, with the manifest written after every
# run (as before store.ManifestSaver) and held back (after); lines 1-2 of results.jsonl were measured at commit
# 30e5dd4, before the metrics CSV's faster NaN pass; the others (run in the order findings.md lists) at 0efbd2c
b --sequential --runs 1000 --manifest-every-run
b --sequential --runs 1000
b --sequential --runs 1000
# the fleet scheduler: spread campaigns of 20 runs per device, each run 1 s of engine time
for n in 1 2 4 8 50; do b --devices "$n" --runs $((20 * n)) --run-s 1; done
# 200 devices, 10 000 runs (50 per device), 1 s each
b --devices 200 --runs 10000 --run-s 1
