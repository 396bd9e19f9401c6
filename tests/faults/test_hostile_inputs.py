"""Hostile input, second round (issue 36): crafted folders and campaign files. Each case is run as a process
(tests.helpers.hostile: forked from this interpreter, or spawned as a user runs it) and must end in one line and a
non-zero exit, without a traceback, a hang or a kill for memory; a sentinel tree beside the folder (known contents,
mtimes and atimes) shows that nothing outside the folder was read, written or deleted.

- a manifest's sha256 tables name only files inside the folder (a fidelity reference's, a run's), and hashing is
  bounded (a sparse 200 GB file in a run folder or as the reference is refused at once, never read);
- a lock file that is a hard link (or a FIFO) is refused before a byte of it is written;
- files of a folder are read with bounds: a 222 MB metrics.csv, a 5,000,000-deep JSON line in state.jsonl;
- acknowledged.txt never acknowledges a missing or wrong hash, and each of its lines needs a reason;
- campaign files and `--set`: a self-referring alias, a billion laughs, 100,000 `[`, a key of 5,000 parts, and
  30,000 fleet targets (refused by count: validating them took 38 s)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.hostile import (
    SECRET,
    SECRET_NAME,
    Base,
    age,
    forked,
    make_base,
    one_line_refusal,
    place,
    secrets_hashes,
    snapshot,
    spawn,
)

SPARSE = 200 * 2**30  # a 200 GB file that takes no disk: reading it whole would take minutes


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Base:
    return make_base(tmp_path_factory.mktemp("hostile-inputs"))


def _edit(folder: Path, change: Callable[[dict], None]) -> None:
    m = json.loads((folder / "manifest.json").read_text())
    change(m)
    (folder / "manifest.json").write_text(json.dumps(m, indent=1) + "\n")


def _finished(m: dict) -> dict:
    return next(r for r in m["runs"] if r["status"] != "pending")


def _ref(sha256: dict[str, str]) -> Callable[[dict], None]:
    """A fidelity reference record naming these files."""
    rec = {"status": "ok", "reason": None, "argv": ["bmoe"], "start": "2026-01-02T00:00:00.000Z", "wall_s": 1.0,
           "sha256": sha256}
    return lambda m: m.update(fidelity_ref=rec)


def _sparse(p: Path, size: int = SPARSE) -> None:
    with open(p, "ab") as f:
        f.truncate(size)


def _hard_link(target: Path, name: Path) -> None:
    os.link(target, name)


H = "0" * 64
READ = ("report", "report --check", "check")  # the commands that read a folder's files
HASH = ("report --check", "check")  # the commands that hash them
CASES: dict[str, tuple[Callable[[Path, Path], None], tuple[str, ...], str]] = {
    # a fidelity reference's sha256 keys were paths: /etc/hostname was opened, a sparse file hung the command
    "ref-hash-absolute": (lambda f, o: _edit(f, _ref({str(o / "victim.txt"): H})), READ,
                          "is not one of the files it hashes (fidelity.ref, fidelity-ref.log)"),
    "ref-hash-dotdot": (lambda f, o: _edit(f, _ref({"../../outside/victim.txt": H})), READ,
                        "fidelity_ref.sha256"),
    "ref-hash-etc": (lambda f, o: _edit(f, _ref({"/etc/hostname": H})), READ, "'/etc/hostname' is not one of"),
    "run-hash-dotdot": (lambda f, o: _edit(f, lambda m: _finished(m)["sha256"].update(
        {"../../../outside/victim.txt": H})), READ, "is not a file of the run's folder"),
    "run-hash-absolute": (lambda f, o: _edit(f, lambda m: _finished(m)["sha256"].update(
        {str(o / "victim.txt"): H})), READ, "is not a file of the run's folder"),
    "sparse-reference": (lambda f, o: (_edit(f, _ref({"fidelity.ref": H})), _sparse(f / "fidelity.ref")), HASH,
                         "fidelity.ref: larger than 1024 MiB"),
    "sparse-in-a-run": (lambda f, o: _sparse(f / "runs" / "r01-c00" / "big.bin"), HASH,
                        "runs/r01-c00/big.bin: larger than 1024 MiB"),
    # lock files: a hard link passed the symbolic-link guard and its target was overwritten
    "folder-lock-hard-link": (lambda f, o: _hard_link(o / "victim.txt", f / ".lock"), ("run",),
                              ".lock: a hard link: 2 names share this file, where bmoe-bench keeps its lock file"),
    "campaign-lock-hard-link": (lambda f, o: _hard_link(o / "victim.txt", f.parent / ".t.lock"), ("run",),
                                ".t.lock: a hard link: 2 names share this file"),
    "campaign-lock-fifo": (lambda f, o: os.mkfifo(f.parent / ".t.lock"), ("run",),
                           ".t.lock: not a plain file, where bmoe-bench keeps its lock file"),
    # sizes and depth of a folder's files: killed for memory, RecursionError
    "huge-metrics": (lambda f, o: _sparse(f / "runs" / "r01-c00" / "metrics.csv", 222 * 10**6), READ,
                     "runs/r01-c00/metrics.csv: larger than 64 MiB"),
    "deep-state-line": (lambda f, o: (f / "runs" / "r01-c00" / "state.jsonl").open("a").write(
        "[" * 5_000_000 + "\n"), READ, "state.jsonl:"),
}
ARGV = {"run": lambda b, f: ["run", str(b.yaml), "--out", str(f.parent), "--no-report"],
        "report": lambda b, f: ["report", str(f)], "report --check": lambda b, f: ["report", str(f), "--check"],
        "check": lambda b, f: ["check", str(f)]}


@pytest.mark.parametrize("name", list(CASES))
def test_a_crafted_folder_is_refused_in_one_line_touching_nothing_outside(name, base, tmp_path):
    craft, commands, says = CASES[name]
    folder, outside = place(base.resumable if commands == ("run",) else base.complete, tmp_path)
    secrets = secrets_hashes(outside)
    craft(folder, outside)
    age(outside)
    for i, cmd in enumerate(commands):
        before, root_before = snapshot(outside), sorted(os.listdir(folder.parent))
        argv = ARGV[cmd](base, folder)
        r = spawn(argv, tmp_path, timeout=90) if i == 0 and name == "sparse-in-a-run" else \
            forked(argv, tmp_path, timeout=60)
        line = one_line_refusal(r)
        assert says in line, f"bmoe-bench {cmd}: {line}"
        assert str(folder) in line or str(folder.parent) in line, line
        shown = r.stdout + r.stderr
        assert SECRET not in shown and SECRET_NAME not in shown and not any(h in shown for h in secrets)
        assert snapshot(outside) == before, f"bmoe-bench {cmd} touched the sentinel tree beside the folder"
        assert sorted(os.listdir(folder.parent)) == root_before, f"bmoe-bench {cmd} left something in --out"
    assert (outside / "victim.txt").read_text() == SECRET + "\n"


# ---- acknowledged.txt -----------------------------------------------------------------------------------------------

def _check(folder: Path, cwd: Path) -> tuple[int, list[str], str]:
    r = forked(["check", str(folder)], cwd)
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, [x.removeprefix(f"{folder}: ") for x in r.stderr.splitlines()[:-1]], r.stdout


@pytest.mark.parametrize("reason", ["", "# the reviewer says these are fine\n"])
def test_acknowledged_txt_never_acknowledges_a_removed_or_wrong_hash(base, tmp_path, reason):
    """A run's sha256 removed and its engine.log tampered with, another run's engine.log too; check's own lines
    pasted into acknowledged.txt (without a reason, then with one): check still fails on every hash line."""
    folder, _ = place(base.complete, tmp_path)
    m = json.loads((folder / "manifest.json").read_text())
    gone, kept = m["runs"][0]["run_id"], m["runs"][1]["run_id"]
    _edit(folder, lambda x: x["runs"][0].pop("sha256"))
    for rid in (gone, kept):
        (folder / "runs" / rid / "engine.log").write_text("rewritten\n")
    rc, lines, _ = _check(folder, tmp_path)
    changed = f"runs/{kept}/engine.log changed since its run was committed (sha256 in manifest.json)"
    assert rc == 1 and changed in lines and any(x.startswith(f"run(s) {gone} have no sha256") for x in lines), lines
    (folder / "acknowledged.txt").write_text(reason + "".join(x + "\n" for x in lines))
    rc, after, out = _check(folder, tmp_path)
    assert rc == 1 and f"{folder}: ok" not in out
    assert changed in after and any(x.startswith(f"run(s) {gone} have no sha256") for x in after), after
    refused = [x for x in after if "acknowledges a missing or wrong sha256, which cannot be acknowledged" in x]
    assert len(refused) == len(lines), after


def test_an_acknowledged_line_needs_its_reason(base, tmp_path):
    folder, _ = place(base.complete, tmp_path)
    _edit(folder, lambda m: m["provenance"]["device"].pop("cpu_model"))
    rc, lines, _ = _check(folder, tmp_path)
    assert rc == 1 and lines == ["provenance: device fingerprint lacks cpu_model"], lines
    ack = folder / "acknowledged.txt"
    ack.write_text("# a reason above another block does not count\n\n" + lines[0] + "\n")
    rc, after, _ = _check(folder, tmp_path)
    assert rc == 1 and after == [lines[0], "acknowledged.txt:3: no reason: put a `# ` comment above it saying why "
                                           "it is accepted"], after
    ack.write_text("# Why: this machine's /proc/cpuinfo names no model\n" + lines[0] + "\n")
    rc, after, out = _check(folder, tmp_path)
    assert rc == 0 and after == [] and f"note: acknowledged (acknowledged.txt): {lines[0]}" in out, (after, out)


def test_acknowledged_txt_is_read_with_a_bound(base, tmp_path):
    folder, _ = place(base.complete, tmp_path)
    _sparse(folder / "acknowledged.txt")
    line = one_line_refusal(forked(["check", str(folder)], tmp_path, timeout=30))
    assert "acknowledged.txt: larger than 1 MiB" in line


# ---- campaign files and --set ---------------------------------------------------------------------------------------

def _laughs() -> str:
    out, prev = "a: &a [x, x, x, x, x, x, x, x, x]\n", "a"
    for n in "bcdefghi":
        out += f"{n}: &{n} [{', '.join(['*' + prev] * 9)}]\n"
        prev = n
    return out + "name: t\n"


def _targets(n: int) -> str:
    return ("name: t\nmodel: {path: model.bin}\nengine: {kind: external, path: /bin/true}\nfleet: {use: compare}\n"
            "targets:\n" + "".join(f"  - {{serial: S{i:05d}, server: '127.0.0.1:5037'}}\n" for i in range(n)))


FILES: dict[str, tuple[Callable[[], str], str]] = {
    "self-alias": (lambda: "name: &x [*x]\n", ":1: aliases (*name) expand to values nested deeper than 32 levels"),
    "billion-laughs": (_laughs, "aliases (*name) expand to more than 500000 values"),
    "deep-brackets": (lambda: "name: " + "[" * 100_000 + "]" * 100_000 + "\n", ":1: "),
    "deep-blocks": (lambda: "".join(" " * i + f"k{i}:\n" for i in range(200)) + " " * 200 + "v: 1\n",
                    "nested deeper than 32 levels"),
    "30000-targets": (lambda: _targets(30_000), "targets: 30000 devices, more than the 1000 one campaign may name"),
}


@pytest.mark.parametrize("name", list(FILES))
def test_a_hostile_campaign_file_is_one_line(name, tmp_path):
    text, says = FILES[name]
    (tmp_path / "model.bin").write_bytes(b"\0" * 16)
    yaml = tmp_path / "c.yaml"
    yaml.write_text(text())
    r = spawn(["validate", str(yaml)], tmp_path, timeout=120) if name == "self-alias" else \
        forked(["validate", str(yaml)], tmp_path, timeout=120)
    line = one_line_refusal(r)
    assert line.startswith(f"Error: {yaml}:") and says in line, line


def test_a_campaign_file_is_read_with_a_bound(tmp_path):
    yaml = tmp_path / "c.yaml"
    _sparse(yaml)
    line = one_line_refusal(forked(["validate", str(yaml)], tmp_path, timeout=30))
    assert line == f"Error: {yaml}: larger than 8 MiB; a campaign file is a few KB"
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # reading it would wait for a writer for ever
    line = one_line_refusal(forked(["validate", str(fifo)], tmp_path, timeout=30))
    assert line.startswith(f"Error: {fifo}: not a plain file")


SETS: dict[str, tuple[str, str]] = {
    "key-of-5000-parts": (".".join(["a"] * 5000) + "=1", "the key has more than 32 dotted parts"),
    "value-of-100000-brackets": ("description=" + "[" * 100_000 + "]" * 100_000, "the value"),
    "value-referring-to-itself": ("description=[&x [*x]]", "the value: aliases (*name) expand to values nested"),
}


@pytest.mark.parametrize("name", list(SETS))
def test_a_hostile_set_argument_is_one_line(name, base, tmp_path):
    arg, says = SETS[name]
    line = one_line_refusal(forked(["validate", str(base.yaml), "--set", arg], tmp_path, timeout=60))
    assert line.startswith("Error: --set ") and says in line and len(line) < 400, line
