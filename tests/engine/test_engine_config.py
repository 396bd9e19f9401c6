"""`bmoe` flags in-process: the declaration drives the parser, validation, the preamble, the stream-only rule
and the README table; a refused flag is one line, with no subprocess and no llama.cpp."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.engine import cli
from harness.engine.config import SPECS, EngineConfig, parse_cli, validate_for_model
from harness.engine.config.doc import readme_block, readme_section
from harness.errors import UserError
from harness.formats.metrics_csv import read_metrics

ROOT = Path(__file__).resolve().parents[2]
M = ["-m", "model.gguf"]


def refused(argv: list[str], *needles: str) -> str:
    with pytest.raises(UserError) as e:
        parse_cli(argv)
    msg = str(e.value)
    assert "\n" not in msg
    for n in needles:
        assert n in msg, msg
    return msg


def test_bug_abbreviated_flag_is_refused_not_run_as_the_mmap_baseline(capsys):
    """`--io 2` once parsed as --io-threads 2, and the argv-string stream-only rule never saw it."""
    refused(M + ["--io", "2", "-n", "4"], "unrecognized arguments: --io 2")
    assert cli.main(M + ["--io", "2", "-n", "4"]) == cli.EXIT_USER
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "--io" in err[0]


@pytest.mark.parametrize("flag", sorted({f for s in SPECS for f in s.flag.flags if f.startswith("--")}))
def test_no_long_flag_can_be_abbreviated(flag):
    prefix = flag[:-1]
    if any(f == prefix for s in SPECS for f in s.flag.flags):
        pytest.skip(f"{prefix} is a flag of its own")
    spec = next(s for s in SPECS if flag in s.flag.flags)
    refused(M + ["--moe-stream", prefix] + ([] if spec.switch else ["1"]), "unrecognized arguments")


def _non_default(spec) -> list[str]:
    """argv that sets this field away from its default, with a value its own checks accept."""
    flag = spec.flag.flags[-1]
    if spec.switch:
        return [flag]
    if spec.flag.choices:
        return [flag, next(c for c in spec.flag.choices() if c != spec.default)]
    if spec.type is str:
        return [flag, "x.csv"]
    base = 0 if spec.default is None else spec.default
    return [flag, str(spec.type(base + 1))]


STREAM_ONLY = [s for s in SPECS if s.flag.stream_only]
# the flags a field needs beside it to be accepted with --moe-stream (its cross-field rule in config/rules.py)
COMPANIONS = {"predict_min_recall": ["--predict-prefetch"]}


@pytest.mark.parametrize("spec", STREAM_ONLY, ids=[s.name for s in STREAM_ONLY])
def test_stream_only_fields_away_from_their_default_need_moe_stream(spec):
    argv = M + _non_default(spec)
    refused(argv, f"{spec.label} only applies with --moe-stream")
    cfg = parse_cli(argv + COMPANIONS.get(spec.name, []) + ["--moe-stream"])
    assert getattr(cfg, spec.name) != spec.default


def test_stream_only_rule_goes_by_value_not_by_spelling():
    refused(M + ["--cache-mb=100"], "--cache-mb only applies")
    refused(M + ["--io-threads=2"], "--io-threads only applies")
    refused(M + ["--no-odirect"], "--no-odirect only applies")
    assert parse_cli(M + ["--io-threads", "4"]).io_threads == 4  # the default: nothing to refuse
    assert parse_cli(M + ["--cache-mb", "auto"]).cache_mb is None


@pytest.mark.parametrize("argv,needle", [
    (["-n", "0"], "-n must be >= 1, got 0"),
    (["-c", "8"], "-c must be >= 16"),
    (["-t", "-1"], "-t must be >= 0"),
    (["--moe-stream", "--io-threads", "0"], "--io-threads must be 1..8, got 0"),
    (["--moe-stream", "--io-threads", "9"], "--io-threads must be 1..8, got 9"),
    (["--moe-stream", "--io-threads", "x"], "--io-threads"),
    (["--n-expert-used", "-1"], "--n-expert-used must be >= 0"),
    (["--temp", "-0.5"], "--temp must be >= 0"),
    (["--moe-stream", "--cache-mb", "-1"], "--cache-mb must be >= 0"),
    (["--moe-stream", "--cache-mb", "lots"], "--cache-mb takes 0, a number of MiB or 'auto'"),
    (["--moe-stream", "--cache-ceil-mb", "-1"], "--cache-ceil-mb must be >= 0"),
    (["--moe-stream", "--cache-policy", "belady"], "unknown --cache-policy 'belady'; choose one of"),
    (["--moe-stream", "--cache-policy", "nope"], "unknown --cache-policy"),
    (["--moe-stream", "--cache-mb", "100", "--cache-ceil-mb", "10"], "--cache-ceil-mb caps --cache-mb auto"),
    (["--moe-stream", "--cache-mb", "0", "--cache-preload"], "--cache-preload needs a cache"),
    (["--moe-streem"], "unrecognized arguments: --moe-streem"),
])
def test_refusals_name_the_flag(argv, needle):
    refused(M + argv, needle)


def test_model_is_required_unless_an_action_flag_is_given():
    refused([], "no model given: pass -m PATH")
    assert parse_cli(["--version"]).version
    assert parse_cli(["--list-archs"]).list_archs


def test_model_checks_need_only_the_models_numbers():
    validate_for_model(parse_cli(M + ["--n-expert-used", "8"]), n_expert=8, k_model=2)
    with pytest.raises(UserError, match=r"--n-expert-used 9 is above the model's 8 experts"):
        validate_for_model(parse_cli(M + ["--n-expert-used", "9"]), n_expert=8, k_model=2)


def test_resolved_preamble_keeps_the_committed_keys_and_spellings():
    """The report reads `cfg.*` from committed CSVs: same keys, same order, same value spellings."""
    path = ROOT / "bench-data/2026-11-30-engine-hook-overhead/runs/r02-c01/metrics.csv"
    committed = {k[4:]: v for k, v in read_metrics(path).meta.items() if k.startswith("cfg.")}
    c = committed
    argv = ["-m", c["model"], "-p", c["prompt"], "-n", c["n_predict"], "-t", c["threads"], "-c", c["ctx"],
            "--moe-stream", "--cache-mb", c["cache_mb"], "--cache-preload", "--csv", c["csv"], "--progress"]
    now = {k: str(v) for k, v in parse_cli(argv).resolved().items()}
    assert [k for k in now if k in committed] == list(committed)  # new flags may add keys, none may go
    assert {k: now[k] for k in committed} == committed
    assert EngineConfig(model="m").resolved()["cache_mb"] == "auto"


def test_readme_flag_table_is_the_declaration():
    text = (ROOT / "README.md").read_text()
    a, b = readme_block(text)
    assert text[a:b] == readme_section(), (
        "README.md's flag table differs from harness/engine/config.py: run "
        "`python -m harness.engine.config --update-readme README.md`")


def test_every_field_is_declared_with_help_and_a_known_type():
    for s in SPECS:
        assert s.flag.flags and s.flag.help, s.name
        assert s.type in (int, float, str, bool)
        assert not (s.flag.lossy and s.flag.action)
