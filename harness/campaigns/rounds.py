"""The round scheduler of a campaign run: the pending runs in plan order, each after the fixed cool-down between
runs and gated on the cooldown condition (a run the gate gave up on under `on_timeout: defer` goes to the end of
the queue, and is left unrun past its budget: harness.campaigns.steady), run as a fresh engine process, its raw
files committed the moment it ends (with the throttling its state samples show: harness.devices.throttle) and the
manifest rewritten (held back while its writes would take over 5% of the time: store.ManifestSaver); with
`precision:`, after every whole round from the minimum on, the decision of harness.campaigns.precision (the
report's own intervals over the rounds so far): stop, or add the next round's runs to the manifest (pending, so a
resumed campaign runs them) and go on."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rich.console import Console

from harness.campaigns import precision, store
from harness.campaigns.fidelity_runs import ensure_reference, score_cell
from harness.campaigns.gate import StateSampler, wait_for_gate
from harness.campaigns.progress import RunProgress
from harness.campaigns.provenance import model_mismatch, model_sha256
from harness.campaigns.questions import take_replies
from harness.campaigns.replicate import by_try, round_of, try_due, wait_for_try
from harness.campaigns.steady import DeferQueue, Pacer, deferral, left_unrun
from harness.campaigns.traces import take_traces, trace_outputs
from harness.campaigns.validate import Plan, engine_argv_tail
from harness.devices.throttle import throttle_record
from harness.errors import UserError
from harness.formats.devstate import STATE_FILE, DeviceSample, write_states
from harness.formats.files import disk_full, is_disk_full
from harness.formats.manifest import ENGINE_LOG, METRICS_FILE, Manifest, RunRecord, save_manifest
from harness.formats.outcome import Deferral, Eviction, GateRecord, Outcome
from harness.formats.progress import parse_progress
from harness.formats.replies import PROMPTS_FILE
from harness.stats import tok_s
from harness.targets.base import RunOutcome, Target


class Resolved(Protocol):
    """What a run needs of the resolved inputs (harness.campaigns.runner.Resolved)."""

    model_path: str  # on the target

    def argv0(self, label: str) -> list[str]: ...


@dataclass
class CampaignResult:
    folder: Path
    n_ok: int
    n_failed: int
    n_skipped: int  # finished in an earlier session
    n_not_run: int = 0  # a fleet campaign: runs left pending because their devices were lost (why: not_run)
    not_run: str = ""
    n_deferred: int = 0  # runs left pending because the gate gave up on them (cooldown.on_timeout: defer)
    deferred: str = ""  # the last reason

    @classmethod
    def of(cls, folder: Path, m: Manifest, skipped: int, n_not_run: int = 0, not_run: str = "",
           deferred: list[int] | None = None) -> CampaignResult:
        """`deferred`: the indices of the runs left unrun by the gate in this session."""
        hot = [m.runs[i] for i in deferred or []]
        return cls(folder=folder, n_ok=sum(r.status == "ok" for r in m.runs),
                   n_failed=sum(r.status == "failed" for r in m.runs), n_skipped=skipped, n_not_run=n_not_run,
                   not_run=not_run, n_deferred=len(hot), deferred=hot[-1].deferrals[-1].reason if hot else "")


@contextmanager
def closing(folder: Path, m: Manifest) -> Iterator[None]:
    """The end of a session of runs, however it ends: on Ctrl-C or an error the half-written run is dropped
    and the manifest's status says why; the session's end time and the manifest are always saved."""
    try:
        yield
    except BaseException as e:
        store.clear_tmp(folder)
        m.status = "interrupted" if isinstance(e, KeyboardInterrupt) else f"stopped: {type(e).__name__}: {e}"
        raise
    finally:
        m.sessions[-1].end = store.iso(time.time())
        save_manifest(folder, m)


def run_all(plan: Plan, m: Manifest, folder: Path, target: Target, res: Resolved, console: Console
            ) -> CampaignResult:
    c = plan.campaign
    p = m.campaign.precision
    skipped = sum(r.finished for r in m.runs)
    prog = RunProgress(console, total_runs=len(m.runs), done_runs=skipped, n_cells=len(plan.cells),
                       tokens=c.tokens)
    rounds = f"{p.min_repeats}-{p.max_repeats}" if p is not None else str(c.repeats)
    saver = store.ManifestSaver(folder)  # after runs, at most 5% of the time; always at the end (closing)
    cd = c.cooldown
    pacer = Pacer(cd.between_runs_s)
    with closing(folder, m):
        ensure_reference(plan, m, folder, target, res, console)  # a fidelity campaign's reference, once
        with prog:
            while True:
                left: list[int] = []  # runs deferred past their budget: left unrun
                pending = [i for i, r in enumerate(m.runs) if not r.finished]
                for _try, part in by_try(m, pending):  # a deferred run goes to the end of its own try
                    queue = DeferQueue(part, cd.max_deferrals)
                    while (i := queue.take()) is not None:
                        r = m.runs[i]
                        if try_due(m, r.try_index) is not None:  # the first run of a try: the wait before it
                            saver.flush(m)
                            wait_for_try(m, r.try_index, prog.note, say=lambda s: console.print(s, highlight=False))
                        cell = plan.cells[r.cell]
                        rnd, of = round_of(r, m.campaign, rounds)
                        prog.start_run(r.run_id, cell.label, rnd, of, cell.index)
                        done = one_run(plan, r, folder, target, res, prog,
                                       m.provenance.model_sha256 if m.provenance else None, m, pacer)
                        if isinstance(done, Deferral):
                            m.runs[i] = r.defer(done)
                            saver.save(m)
                            prog.deferred(r.run_id, cell.label, done.reason, queue.defer(i))
                            continue
                        outcome, hashes = done
                        m.runs[i] = r.finish(outcome, hashes)
                        saver.save(m)
                        prog.end_run(r.run_id, cell.label, outcome.dump())
                    left += queue.left
                if left or p is None or not _add_round(plan, m, folder, prog):
                    break
        m.status = "complete" if all(r.finished for r in m.runs) else (left_unrun(m.runs) or "running")
    return CampaignResult.of(folder, m, skipped, deferred=left)


def _add_round(plan: Plan, m: Manifest, folder: Path, prog: RunProgress) -> bool:
    """Every run so far finished: decide on precision; add the next round's runs (pending) unless it stops."""
    p = m.campaign.precision
    assert p is not None
    decision, ratios = precision.decision(folder, m, p)
    rounds = 1 + max(r.round for r in m.runs)
    labels = {c.index: c.label for c in plan.cells}
    widths = {labels[c]: (iv.sequential().half_width if iv is not None else float("inf")) for c, iv in ratios.items()}
    prog.precision(rounds, p.ratio_half_width, widths, decision)
    if decision is not None:
        return False
    m.runs += [RunRecord(run_id=s.run_id, round=s.round, cell=s.cell, position=s.position, status="pending")
               for s in precision.round_runs(len(plan.cells), rounds, m.campaign.order, m.campaign.seed)]
    save_manifest(folder, m)
    prog.add_runs(len(plan.cells))
    return True


def one_run(plan: Plan, r: RunRecord, folder: Path, target: Target, res: Resolved,
            prog: RunProgress, want_model: dict[str, str] | None, m: Manifest | None = None,
            pacer: Pacer | None = None) -> tuple[Outcome, dict[str, str]] | Deferral:
    """Run it, write its raw files, commit its folder: (its outcome, the sha256 of each of its files). A
    model file other than the campaign's (`want_model`, its sha256) fails the run without starting it. `pacer`:
    the device's fixed cool-down between runs. With `cooldown.on_timeout: defer`, a gate that gives up gives the
    run's Deferral instead: nothing started, nothing committed."""
    c = plan.campaign
    cell = plan.cells[r.cell]
    attempt = len(r.previous_attempts) + 1  # a retried run keeps the earlier ones' files (store.commit_run)
    tmp = store.tmp_run_dir(folder, r.run_id)
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir(parents=True)
    except OSError as e:
        if is_disk_full(e):
            raise disk_full(tmp, None) from None
        raise

    have_model = model_sha256(target, res.model_path)
    refuse = model_mismatch(want_model, have_model) if want_model is not None else None
    if refuse is not None:
        write_states(tmp / STATE_FILE, [])
        refused = _refused(refuse, store.iso(time.time()), have_model)
        return refused, store.commit_run(folder, r.run_id, refused, attempt)
    rested = pacer.rest(prog.waiting) if pacer is not None else None
    gate = wait_for_gate(target.sample_state, c.cooldown, on_wait=prog.waiting)
    later = deferral(gate, c.cooldown, store.iso(time.time()), rested)
    if later is not None:
        shutil.rmtree(tmp, ignore_errors=True)
        return later
    evicted = None
    if c.target.kind == "local" and c.target.evict_model:
        from harness.campaigns.pagecache import evict_model_files

        evicted = evict_model_files(Path(res.model_path))
    remote_csv = f"{target.run_dir().rstrip('/')}/{r.run_id}.csv"
    outputs = [remote_csv]
    quality: dict[str, str] = {}
    if c.quality is not None:  # the folder's questions in, this run's replies out
        quality = {"prompts": target.stage(folder / PROMPTS_FILE, "prompts"),
                   "replies": f"{target.run_dir().rstrip('/')}/{r.run_id}.replies.jsonl"}
        outputs.append(quality["replies"])
    traces = trace_outputs(target.run_dir(), r.run_id) if c.traces else {}
    outputs += traces.values()
    # a quality run's tokens are in its CSV and its replies: no progress line per token in engine.log (a
    # hundred questions of hundreds of tokens would make it the folder's biggest file); its log has the text
    argv = res.argv0(cell.engine) + engine_argv_tail(c, cell, model=res.model_path, csv=remote_csv,
                                               progress=c.quality is None, **quality, **traces)
    argv = getattr(target, "argv_prefix", []) + argv  # prepare.pin_cores: `taskset MASK` (recorded in the outcome)

    def on_line(line: str) -> None:
        d = parse_progress(line)
        if d is not None:
            prog.token(d)

    t_start = time.time()
    if pacer is not None:
        pacer.ran()
    with StateSampler(target.sample_state) as sampler:
        done: RunOutcome = target.run(argv, timeout_s=c.timeout_s, outputs=outputs, out_dir=tmp,
                                      log_path=tmp / ENGINE_LOG, on_stdout_line=on_line)
    t_end = time.time()

    reason = done.reason
    csv_local = done.fetched.get(remote_csv)
    n_tokens = None
    decode_tok_s = None
    if csv_local is not None:
        dest = tmp / METRICS_FILE
        if Path(csv_local) != dest:
            Path(csv_local).replace(dest)
        if reason is None:
            from harness.formats.metrics_csv import read_metrics

            try:
                mt = read_metrics(dest)
                bad = mt.problem(None)
                if bad is not None:
                    raise UserError(bad)
                n_tokens = len(mt.rows)
                decode_tok_s = round(tok_s(mt.wall_ms()), 4)
            except UserError as e:
                reason = f"engine exited 0 but its CSV is unreadable: {e}"
    elif reason is None:
        reason = "engine exited 0 but wrote no metrics CSV"
    if quality:
        reason = take_replies(done.fetched.get(quality["replies"]), tmp, len(c.quality.ids or [])
                              or int(c.quality.n or 0), reason)
    if reason is None:
        reason = take_traces(done.fetched, traces, tmp)
    if reason is None and done.exit_code == 0 and m is not None:  # a scored cell's first round: its fidelity
        reason = score_cell(plan, m, r, folder, tmp, target, res)
    write_states(tmp / STATE_FILE, sampler.samples)

    outcome = Outcome(
        status="ok" if reason is None and done.exit_code == 0 else "failed",
        reason=reason if reason is not None or done.exit_code == 0 else f"engine exited {done.exit_code}",
        start=store.iso(t_start), end=store.iso(t_end), wall_s=round(done.wall_s, 3),
        exit_code=done.exit_code, tokens=n_tokens, tok_s_all=decode_tok_s,
        peak_mem_mib=done.peak_mem_mib,
        oom_killed=done.oom_killed, argv=argv,
        model_evicted=Eviction(**evicted) if evicted is not None else None,
        gate=GateRecord(**gate.record(), **({"rested_s": rested} if rested is not None else {})),
        entry_state=DeviceSample(**gate.entry),
        n_state_samples=len(sampler.samples), sampler_errors=sampler.errors, model_sha256=have_model,
        throttle=throttle_record(sampler.samples, end_t=t_end),
    )
    return outcome, store.commit_run(folder, r.run_id, outcome, attempt)


def _refused(reason: str, t: str, model: dict[str, str]) -> Outcome:
    """The outcome of a run not started (every field given, as for any finished run)."""
    return Outcome(status="failed", reason=reason, start=t, end=t, wall_s=0.0, exit_code=None, tokens=None,
                   tok_s_all=None, peak_mem_mib=None, oom_killed=None, argv=None, model_evicted=None, gate=None,
                   entry_state=None, n_state_samples=0, sampler_errors=[], model_sha256=model)
