"""A campaign folder's file names, declared once: bench-data/<YYYY-MM-DD>-<campaign>/ as the runner writes it
and the report reads it (harness.campaigns.store describes the folder; each file's format is its own module).

    campaign.yaml                 CAMPAIGN_FILE: the campaign file, verbatim
    manifest.json                 MANIFEST (harness.formats.manifest)
    runs/<run_id>/                RUNS: one run's raw files, each hashed in the manifest:
        metrics.csv               METRICS_FILE: the engine's bmoe_metrics CSV (harness.formats.metrics_csv)
        engine.log                ENGINE_LOG: its stdout and stderr
        state.jsonl               STATE_FILE: device samples (harness.formats.devstate)
        outcome.json              OUTCOME_FILE (harness.formats.outcome)
        replies.jsonl             REPLIES_FILE: a quality run's replies (harness.formats.replies)
        io_trace.csv              IO_TRACE_FILE, COMPUTE_TRACE_FILE: a traced run's traces (harness.formats.traces)
        compute_trace.csv
        attempt-<n>/              ATTEMPT_DIR: a retried run's earlier attempt n (1 = the first), its files as
                                  they were (hashed with the run: --retry-failed keeps the evidence of a failure)
    fidelity.ref                  FIDELITY_REF: a fidelity campaign's reference (harness.formats.fidelity), made once
    fidelity-ref.log              FIDELITY_REF_LOG: its engine's stdout and stderr (both hashed in the manifest)
    runs/<run_id>/fidelity.csv    FIDELITY_CSV, FIDELITY_LOG: a scored cell's per-position figures against it and
    runs/<run_id>/fidelity.log    its scoring run's output (the cell's first-round run only)
    prompts.jsonl                 PROMPTS_FILE: a quality campaign's questions, as handed to every run
    findings.md, results.csv      FINDINGS, RESULTS: written by `bmoe-bench report` (a replay study's folder
                                  has its findings.md too)
    plots/                        PLOTS_DIR: its figures
    grades.json                   GRADES_FILE: a quality campaign's grades (harness.formats.grades)
"""

from __future__ import annotations

CAMPAIGN_FILE = "campaign.yaml"
MANIFEST = "manifest.json"
RUNS = "runs"
METRICS_FILE = "metrics.csv"
ENGINE_LOG = "engine.log"
STATE_FILE = "state.jsonl"
OUTCOME_FILE = "outcome.json"
REPLIES_FILE = "replies.jsonl"
IO_TRACE_FILE = "io_trace.csv"
COMPUTE_TRACE_FILE = "compute_trace.csv"
PROMPTS_FILE = "prompts.jsonl"
FINDINGS = "findings.md"
RESULTS = "results.csv"
PLOTS_DIR = "plots"
GRADES_FILE = "grades.json"
ATTEMPT_DIR = "attempt-{n}"  # runs/<run_id>/attempt-<n>/
FIDELITY_REF = "fidelity.ref"
FIDELITY_REF_LOG = "fidelity-ref.log"
FIDELITY_CSV = "fidelity.csv"
FIDELITY_LOG = "fidelity.log"
