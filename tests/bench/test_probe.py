"""The I/O roofline's bandwidth probe (harness.campaigns.probe) on real generated models: it reads through the engine's
own lanes what a streamed token reads (each layer's top-k experts' whole slices), says how, honours its byte budget,
takes the cells' lane count, and says "not measured" in one line for a file that is not a MoE model."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.campaigns.expand import Cell
from harness.campaigns.probe import DEFAULT_LANES, lanes_of, probe_read_bandwidth
from harness.synth import make_model
from harness.synth.shapes import shape_spec


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    (m,) = make_model(tmp_path_factory.mktemp("probe") / "m.gguf", shape_spec("tiny", n_layer=3, n_expert=8,
                                                                              n_expert_used=2))
    return m


def test_it_reads_the_model_as_the_lanes_do(model):
    r = probe_read_bandwidth(model, lanes=3, seconds=0.5, max_mib=8)
    assert r["mib_s"] and r["mib_s"] > 0
    m = r["method"]
    assert "the engine's read lanes (" in m and "3 lanes" in m and "top-2 random experts' whole slices" in m
    rates = m.split("the best of 1/2/4 layers in flight (")[1].split(" MiB/s)")[0].split(" / ")
    assert len(rates) == 3 and max(float(x) for x in rates) == pytest.approx(r["mib_s"], abs=1)


def test_it_stops_at_its_byte_budget(model):
    m = probe_read_bandwidth(model, seconds=5.0, max_mib=4, depths=(2,))["method"]
    got = float(m.rsplit("): 2, ", 1)[1].split(" MiB")[0])
    assert 4 <= got < 5, m  # the batch in flight when the budget was reached is finished


@pytest.mark.parametrize("content", [b"", b"GGUF" + b"\0" * 60, b"\0" * 4096])
def test_a_file_that_is_not_a_moe_model_is_not_measured(tmp_path, content):
    p = tmp_path / "x.gguf"
    p.write_bytes(content)
    r = probe_read_bandwidth(p)
    assert r["mib_s"] is None and r["method"].startswith("not measured: ") and "\n" not in r["method"]
    assert probe_read_bandwidth(tmp_path / "missing.gguf")["mib_s"] is None


def test_lanes_of_the_cells():
    def cell(**flags) -> Cell:
        return Cell(index=0, flags=flags, varied={}, line=None)  # type: ignore[arg-type]

    assert lanes_of([cell()]) == DEFAULT_LANES
    assert lanes_of([cell(**{"--io-threads": 2}), cell(**{"--io-threads": 6})]) == 6
    assert lanes_of([cell(**{"--io-threads": 99}), cell(**{"--io-threads": True})]) == DEFAULT_LANES
