"""The reclaim-storm verdict (harness.engine.run.pressure) over token rows, without llama.cpp; and the PSI reader
on this machine's own /proc/pressure/memory or a written file."""

from __future__ import annotations

from pathlib import Path

from harness.engine.io import sysstats
from harness.engine.run.pressure import Pressure
from harness.formats.metrics_csv import TokenRow


def _rows(n: int, *, wall: float = 100.0, stall: float = 0.0, majflt: int = 0, frac: float = 1.0) -> Pressure:
    p = Pressure()
    for i in range(1, n + 1):
        p.add(TokenRow(step=i, steps=n, wall_ms=wall, mem_stall_ms=stall, majflt=majflt,
                       dense_resident_frac=frac if i % 4 == 1 else -1))
    return p


def test_a_calm_run_gives_no_warning():
    assert _rows(12).warning("mmap", streamed=True) is None
    assert _rows(12, stall=9.0, frac=0.91).warning("mmap", streamed=True) is None  # just under both thresholds


def test_dense_weights_reclaimed_names_the_symptom_and_anon_as_the_remedy():
    """The measured cliff: 448 MiB cap, 160 MiB cache, dense weights mmap: 57% resident, 13 faults per token."""
    w = _rows(12, wall=900.0, stall=80.0, majflt=13, frac=0.57).warning("mmap", streamed=True)
    assert w is not None and w.count("\n") == 0
    assert w.startswith("bmoe: warning: reclaim storm: only 57% of the dense weights stayed in memory")
    assert "13.0 major faults per token" in w and "pass --dense-weights anon" in w


def test_memory_stall_alone_counts_and_the_remedy_fits_the_mode():
    p = _rows(10, wall=100.0, stall=20.0)
    assert "20% of decode time stalled on memory (PSI)" in p.warning("anon", streamed=True)
    assert "smaller --cache-mb" in p.warning("anon", streamed=True)
    assert "--dense-weights anon" not in p.warning("anon", streamed=True)
    assert "stream the experts (--moe-stream)" in p.warning("mmap", streamed=False)


def test_unmeasured_values_do_not_count():
    p = _rows(8, stall=-1, frac=-1)
    assert p.stall_rows == 0 and p.min_dense_frac is None and p.warning("mmap", streamed=True) is None
    assert Pressure().warning("mmap", streamed=True) is None


def test_psi_reader(tmp_path: Path):
    f = tmp_path / "memory.pressure"
    f.write_text("some avg10=0.00 avg60=0.01 avg300=0.09 total=16917146\nfull avg10=0.00 avg60=0.00 "
                 "avg300=0.00 total=5216000\n")
    assert sysstats.psi_some_us(f) == 16917146
    assert sysstats.psi_some_us(tmp_path / "absent") == -1
    f.write_text("garbage\n")
    assert sysstats.psi_some_us(f) == -1
    path, source = sysstats.psi_memory_path()
    if path is None:
        assert source.startswith("unmeasured")
    else:
        assert sysstats.psi_some_us(path) >= 0 and "PSI" in source
