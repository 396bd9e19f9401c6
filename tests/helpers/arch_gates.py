"""The byte-identity gates every architecture's tiny model passes (test_gemma4.py, test_deepseek4.py,
test_bailingmoe3.py): streamed == resident with the cache off, with a cache small enough to evict, O_DIRECT on
(the default) and off, 2 reader lanes; and the negative control that one wrong expert changes the output."""

from __future__ import annotations

from pathlib import Path

from harness.formats.route_trace import DECODE, read_route_trace
from tests.gates.test_engine_gates import _stream

# (flags, cache evicts): the cache budget in MiB is formatted in, large enough to be over one token cycle and
# small enough to evict on the tiny models
GATE_FLAGS: list[tuple[str, ...]] = [
    ("--cache-mb", "0"),
    ("--cache-mb", "{cache}"),
    ("--cache-mb", "{cache}", "--io-threads", "2"),
    ("--cache-mb", "{cache}", "--no-odirect"),
]


def check_gate(models, resident, tmp_path: Path, name: str, flags: tuple[str, ...], cache_mb: int) -> None:
    flags = tuple(f.format(cache=cache_mb) for f in flags)
    r = _stream(models, tmp_path, name, *flags)
    assert r.tokens == resident(name)
    assert r.preamble["hook_front"] == "c-filter"
    assert r.preamble["odirect_effective"] == ("0" if "--no-odirect" in flags else "1")
    assert r.summary["mib_read_per_token"] > 0
    if flags[1] == "0":
        assert r.summary["hit_pct"] == -1
    else:
        assert r.summary["evictions"] > 0, "the cache was meant to evict"
    if "--io-threads" in flags:
        assert r.preamble["cfg.io_threads"] == "2"


def decode_expert(models, tmp_path: Path, name: str, layer: int) -> int:
    """An expert that layer `layer` routes to in decode (from a route trace of the cache-off run)."""
    trace = tmp_path / "t.route.csv"
    _stream(models, tmp_path, name, "--cache-mb", "0", "--route-trace", str(trace))
    return next(r.expert for r in read_route_trace(trace).rows if r.phase == DECODE and r.layer == layer)


def check_wrong_expert_diverges(models, resident, tmp_path: Path, name: str, layer: int, n_expert: int) -> None:
    expert = decode_expert(models, tmp_path, name, layer)
    env = {"BMOE_TEST_WRONG_EXPERT": f"{layer},{expert},{(expert + 1) % n_expert}"}
    r = _stream(models, tmp_path, name, "--cache-mb", "0", env=env)
    assert r.tokens != resident(name)
