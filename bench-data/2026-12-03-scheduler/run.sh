#!/bin/sh
# Reproduces results.jsonl in this folder (from the repository root, the project's venv active; about 25 minutes
# on 2 cores). Each line: one campaign on simulated devices (python -m harness.bench_sched --help says what it
# measures). findings.md reads them.
set -e
out=bench-data/2026-12-03-scheduler/results.jsonl
b() { nice -n 19 ionice -c3 python -m harness.bench_sched --out "$out" "$@"; }
# the one-target runner, engine time 0: the harness's own time per run, and how it grows with the runs;
# before (--manifest-every-run: the manifest written after every run) and after store.ManifestSaver
for runs in 1000 3000; do b --sequential --runs "$runs" --manifest-every-run; done
for runs in 1000 3000 10000; do b --sequential --runs "$runs"; done
# the fleet scheduler, a spread campaign of 50 runs per device, each run 2 s of engine time
for n in 1 2 4 8 50 200; do b --devices "$n" --runs $((50 * n)) --run-s 2; done
# 200 devices, 10 000 runs, no engine time: the harness alone, as fast as it goes
b --devices 200 --runs 10000 --run-s 0
