"""The build tools bmoe's own build needs, as pyproject.toml's [build-system] `requires` declares them (read from
there: declared once). scripts/setup.sh installs them into the venv (`python -m harness.deploy.build_tools` prints them
and exits 1 while one is missing or too old); `bmoe-bench deploy` checks the harness has them before copying them
to a target, whose own venv's (setuptools 65) cannot read pyproject.toml's license string. Standard library only:
setup.sh runs it before anything is installed."""

from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
_REQ = re.compile(r"^([A-Za-z0-9_.-]+)\s*(?:>=\s*([0-9][0-9.]*))?$")  # the only forms [build-system] uses here


def requires(pyproject: Path = PYPROJECT) -> list[str]:
    return list(tomllib.loads(pyproject.read_text())["build-system"]["requires"])


def parse(req: str) -> tuple[str, str | None]:
    """(lower-case name, least version or None) of one requirement; ValueError for another form."""
    m = _REQ.match(req.strip())
    if m is None:
        raise ValueError(f"pyproject.toml: build requirement {req!r} is not NAME or NAME>=VERSION")
    return m.group(1).lower(), m.group(2)


def _release(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


def unmet(reqs: list[str], installed: dict[str, str]) -> list[str]:
    """The requirements `installed` (name -> version, names in lower case) does not meet, as 'name>=X (have Y)'."""
    out = []
    for r in reqs:
        name, least = parse(r)
        have = installed.get(name)
        if have is None or (least is not None and _release(have) < _release(least)):
            out.append(f"{r} (have {have or 'none'})")
    return out


def installed_here(reqs: list[str]) -> dict[str, str]:
    out = {}
    for r in reqs:
        name = parse(r)[0]
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


if __name__ == "__main__":
    want = requires()
    print(" ".join(want))
    sys.exit(1 if unmet(want, installed_here(want)) else 0)
