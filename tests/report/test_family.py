"""A campaign family across model sizes (`family:` in the campaign file; reports/<family>.md and .png from
`bmoe-bench report --all`): members ordered by model size, known ratios and roofline shares, cells that do not
match the family's named, --check catching a stale or missing family report, and the key's validation."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.bench_cli import main
from harness.formats.manifest import LocalTargetDesc, load_manifest, save_manifest
from harness.report.family import check_families, load_family, render
from tests.helpers.folders import csv_text, make_folder

CELLS = [("mmap", {}), ("stream", {"--moe-stream": True})]


def member(root: Path, name: str, *, model_bytes: int, cap: int, base_ms: float, stream_ms: float,
           stream_mib: float, cells=CELLS, family: str = "roofline") -> Path:
    """Two rounds of each cell with constant per-token walls (the first token is warm-up); 100 MiB/s storage."""
    pre = {"model_bytes": model_bytes, "arch": "qwen3moe", "n_layer": 4, "n_expert": 16, "n_expert_used_model": 4}
    texts = [csv_text([base_ms] * 5, preamble={**pre, "mode": "mmap"}, read_mib=10.0),
             csv_text([stream_ms] * 5, preamble={**pre, "mode": "stream"}, read_mib=stream_mib)]
    runs = [(c, r, texts[c]) for r in range(2) for c in (range(2) if r == 0 else (1, 0))]
    tmp = root.parent / f"tmp-{name}"
    folder = make_folder(tmp, cells, runs, bandwidth={"mib_s": 100.0, "method": "test"})
    m = load_manifest(folder)
    m = m.model_copy(update={"campaign": m.campaign.model_copy(update={"family": family}),
                             "target": LocalTargetDesc(kind="local", cpus=2, mem_cap_mib=cap)})
    save_manifest(folder, m)
    root.mkdir(exist_ok=True)
    return Path(shutil.move(folder, root / name))


def test_members_by_size_with_known_ratios_and_roofline_shares(tmp_path):
    root = tmp_path / "bench-data"
    # the larger model's folder sorts first by name: the report must order by model size
    member(root, "2026-01-01-roofline-big", model_bytes=4 * 2**30, cap=1024, base_ms=400.0, stream_ms=50.0,
           stream_mib=1.0)
    member(root, "2026-01-02-roofline-small", model_bytes=2**29, cap=256, base_ms=100.0, stream_ms=50.0,
           stream_mib=1.0)
    fam = load_family(root)
    assert list(fam) == ["roofline"]
    members = fam["roofline"]
    assert [m.folder for m in members] == ["2026-01-02-roofline-small", "2026-01-01-roofline-big"]
    text = render("roofline", members, "roofline.png")
    rows = [line for line in text.splitlines() if line.startswith("| ") and "`2026" in line]
    assert len(rows) == 4
    small_stream, big_stream = rows[1], rows[3]
    # stream at 50 ms/token = 20 tok/s; the bases 10 and 2.5 tok/s; constant walls: the intervals are points
    assert "| 2.00x [2.00, 2.00] |" in small_stream and "| 8.00x [8.00, 8.00] |" in big_stream
    assert "| 2.0x |" in small_stream and "| 4.0x |" in big_stream  # model / cap
    # 1 MiB/token at 100 MiB/s: I/O roofline 100 tok/s (20%); compute 30 ms/token: combined 33.33 tok/s (60%)
    cols = [c.strip() for c in small_stream.strip("|").split("|")]
    assert cols[6:11] == ["1.0", "100.00", "20%", "33.33", "60%"]
    assert rows[0].split("|")[6].strip() == "base"
    assert "no such" not in text and "not comparable" not in text


def test_a_member_with_other_cells_is_named(tmp_path):
    root = tmp_path / "bench-data"
    member(root, "2026-01-01-a", model_bytes=2**29, cap=256, base_ms=100.0, stream_ms=50.0, stream_mib=1.0)
    member(root, "2026-01-02-b", model_bytes=2**30, cap=256, base_ms=100.0, stream_ms=50.0, stream_mib=1.0,
           cells=[("mmap", {}), ("other", {"--x": 1})])
    text = render("roofline", load_family(root)["roofline"], "roofline.png")
    assert ("- `2026-01-02-b` has cells ['mmap', 'other'], the family's are ['mmap', 'stream']: its rows are not "
            "comparable cell for cell") in text


def test_report_all_writes_and_checks_the_family(tmp_path, capsys):
    root = tmp_path / "bench-data"
    member(root, "2026-01-01-a", model_bytes=2**29, cap=256, base_ms=100.0, stream_ms=50.0, stream_mib=1.0)
    out = tmp_path / "reports"
    assert main(["report", "--all", str(root)]) == 0
    assert (out / "roofline.md").is_file() and (out / "roofline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["report", "--all", "--check", str(root)]) == 0
    capsys.readouterr()
    (out / "roofline.md").write_text((out / "roofline.md").read_text().replace("2.00x", "2.10x"))
    assert main(["report", "--all", "--check", str(root)]) == 2
    assert "roofline.md differs from what" in capsys.readouterr().err
    (out / "roofline.png").unlink()
    assert any("is missing" in b for b in check_families(root, out))


@pytest.mark.parametrize("bad", ["../x", "Roof", "a/b", ""])
def test_family_name_is_a_plain_name(tmp_path, capsys, bad):
    f = tmp_path / "c.yaml"
    f.write_text(f"name: c\nfamily: {bad!r}\nmodel: {{path: m.gguf}}\n")
    assert main(["validate", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "family" in err
