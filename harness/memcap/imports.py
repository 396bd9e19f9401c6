"""What the Python side of an engine costs in memory, import by import.

    python -m harness.memcap.imports [--fresh] [--engine] [MODULE ...]

In one fresh interpreter, imports each MODULE in the order given and prints what the process's resident memory grew
by (/proc/self/smaps_rollup: Rss and, of it, Anonymous, which a memory cgroup always charges; file pages are charged
only to whoever first read them into the page cache) and how many modules each import brought. A dependency is
counted at the first import that brings it. `--fresh` measures each MODULE alone in its own interpreter instead (what
it costs with its dependencies). `--engine` adds, last, what a streamed `bmoe` run imports before its first token
(ENGINE: the command line, the composition root, the llama.cpp bindings) and lists the third-party packages that are
then loaded. A MODULE written `alone:pkg.sub` is imported as the engine imports its bindings, without pkg's __init__
(harness.formats.partial_import). One JSON object per line on stdout.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

from harness.formats.partial_import import submodule_alone
from harness.memcap.smaps import parse_kv_kb

DEFAULT = ("numpy", "llama_cpp", "gguf", "jinja2", "pydantic", "pandas", "rich", "typer", "yaml")
# what harness.engine.cli.run imports for a plain streamed run (the session's llama_cpp.llama_cpp included, imported as
# the session does: `alone:` = harness.formats.partial_import.submodule_alone, without the package's __init__)
ENGINE = ("harness.engine.cli", "harness.engine.config", "harness.engine.compose",
          "harness.engine.io.lazymap", "harness.engine.io.faults", "alone:llama_cpp.llama_cpp")
MIB = 1 << 20


def _rollup() -> dict[str, int]:
    return parse_kv_kb(Path("/proc/self/smaps_rollup").read_text())


def third_party() -> list[str]:
    """Top-level packages loaded now that are neither the standard library nor harness, in load order."""
    std = set(sys.stdlib_module_names) | {"harness", "__main__", "_distutils_hack"}
    out = []
    for name in list(sys.modules):
        top = name.split(".", 1)[0]
        if top not in std and not top.startswith("_") and top not in out:
            out.append(top)
    return out


def measure(modules: list[str]) -> list[dict]:
    prev, n_prev = _rollup(), len(sys.modules)
    rows = [{"step": "interpreter", "rss_mib": round(prev["Rss"] / MIB, 2),
             "anon_mib": round(prev["Anonymous"] / MIB, 2), "modules": n_prev}]
    for m in modules:
        if m.startswith("alone:"):
            submodule_alone(m.removeprefix("alone:"))
        else:
            importlib.import_module(m)
        now = _rollup()
        rows.append({"step": m, "rss_mib": round((now["Rss"] - prev["Rss"]) / MIB, 2),
                     "anon_mib": round((now["Anonymous"] - prev["Anonymous"]) / MIB, 2),
                     "modules": len(sys.modules) - n_prev})
        prev, n_prev = now, len(sys.modules)
    rows.append({"step": "total", "rss_mib": round(prev["Rss"] / MIB, 2), "anon_mib": round(prev["Anonymous"] / MIB, 2),
                 "modules": n_prev, "third_party": third_party()})
    return rows


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    fresh, engine = "--fresh" in args, "--engine" in args
    mods = [a for a in args if not a.startswith("--")] or (list(DEFAULT) if not engine else [])
    unknown = [a for a in args if a.startswith("--") and a not in ("--fresh", "--engine")]
    if unknown:
        sys.stderr.write(f"Error: unknown option {unknown[0]} (see python -m harness.memcap.imports's docstring)\n")
        return 2
    if fresh:
        for m in mods + ([",".join(ENGINE)] if engine else []):
            out = subprocess.run([sys.executable, "-m", "harness.memcap.imports", *m.split(",")], capture_output=True,
                                 text=True)
            if out.returncode != 0:
                sys.stderr.write(out.stderr)
                return out.returncode
            rows = [json.loads(s) for s in out.stdout.splitlines()]
            base, total = rows[0], rows[-1]
            print(json.dumps({"step": m, "alone": True, "rss_mib": round(total["rss_mib"] - base["rss_mib"], 2),
                              "anon_mib": round(total["anon_mib"] - base["anon_mib"], 2),
                              "modules": total["modules"] - base["modules"], "third_party": total["third_party"]}))
        return 0
    try:
        rows = measure(mods + (list(ENGINE) if engine else []))
    except ImportError as e:
        sys.stderr.write(f"Error: cannot import {e.name}: {e}\n")
        return 2
    for r in rows:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
