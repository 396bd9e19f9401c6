"""The local files a campaign expects to be made before it runs, and what makes each, so that `bmoe-bench validate`
can check a shipped campaign on a fresh clone: it names them, one line each, instead of failing on them.

Two makers are known, both read from what the repository already says (no campaign key declares them):
- the trained-model recipe: a path under its output folder, `${XDG_CACHE_HOME:-~/.cache}/bmoe/recipe/<size>/out/`,
  is made by `scripts/train-model.sh <size>` (the folder scripts/train-model.sh writes by default);
- a script of `scripts/` that runs the campaign file and passes the path's key with `--set KEY=...` (e.g.
  scripts/fleet-loopback.sh makes the model and the engine wrapper it passes to campaigns/fleet-loopback.yaml).

Any other missing file is still a problem: one the user was meant to give. `run` is unchanged: it needs every file."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from harness.campaigns.schema import Campaign
from harness.campaigns.validate import Plan, local_file_problems, plan_campaign
from harness.campaigns.yamlsrc import CampaignError

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"


@dataclass(frozen=True)
class Made:
    key: str  # the campaign key naming the file: model.path, model.push_from, engine.push_from
    path: str  # as the campaign (or its --set) gives it
    maker: str  # what makes it: a command to run
    how: str  # how the maker gives it to the campaign

    def line(self, c: Campaign) -> str:
        where = c.place(c.lines.get(self.key.split(".")[0], 1))
        return (f"{where}: {self.key} {self.path} is made by `{self.maker}` ({self.how}); not there yet: "
                "checked when it is, and `run` needs it")


def recipe_root() -> Path:
    """The recipe's default base folder (scripts/train-model.sh: `${XDG_CACHE_HOME:-$HOME/.cache}/bmoe/recipe`)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "bmoe" / "recipe"


def recipe_maker(p: Path) -> tuple[str, str] | None:
    """(`scripts/train-model.sh <size>`, how) when p is in the recipe's output folder of a size it knows."""
    from harness.recipe.sizes import SIZES

    try:
        rel = p.resolve().relative_to(recipe_root().resolve())
    except ValueError:
        return None
    if len(rel.parts) >= 3 and rel.parts[0] in SIZES and rel.parts[1] == "out":
        return f"scripts/train-model.sh {rel.parts[0]}", "the trained-model recipe's output folder"
    return None


def script_maker(c: Campaign, key: str) -> tuple[str, str] | None:
    """The script of scripts/ that runs this campaign file and passes `key` with --set (it makes that file), or
    None. The campaign is matched by its path inside the repository (campaigns/NAME.yaml)."""
    try:
        rel = Path(c.source).resolve().relative_to(REPO).as_posix()
    except ValueError:
        return None
    sets = re.compile(r"--set[ =]+[\"']?" + re.escape(key) + "=")
    for script in sorted(SCRIPTS.glob("*.sh")):
        text = script.read_text(encoding="utf-8", errors="replace")
        if rel in text and sets.search(text):
            return script.relative_to(REPO).as_posix(), f"it runs this campaign with --set {key}=..."
    return None


def made_files(c: Campaign) -> list[Made]:
    """The campaign's missing local files that the recipe or a script makes, in the order validate checks them."""
    wanted = [("model.path", c.model.path if c.target.kind == "local" else None),
              ("model.push_from", c.model.push_from), ("engine.push_from", c.engine.push_from)]
    out = []
    for key, p in wanted:
        if p is None or c.resolve_local(p).exists():
            continue
        maker = recipe_maker(c.resolve_local(p)) or script_maker(c, key)
        if maker is not None:
            out.append(Made(key, p, *maker))
    return out


def _set_aside(c: Campaign, made: list[Made]) -> Campaign:
    """The campaign without the made files' keys, so that only the other files are checked."""
    keys = {m.key for m in made}
    model = c.model.model_copy(update={k.split(".")[1]: None for k in keys if k.startswith("model.")})
    engine = c.engine.model_copy(update={k.split(".")[1]: None for k in keys if k.startswith("engine.")})
    return c.model_copy(update={"model": model, "engine": engine})


def plan_template(path: Path | str, overrides: list[str] | tuple[str, ...] = ()) -> tuple[Plan, list[Made]]:
    """plan_campaign's check, except that a missing file the recipe or a script makes is not a problem: it is
    returned as a Made. Every other problem (a missing file the user gives included) raises CampaignError."""
    try:
        return plan_campaign(path, overrides=overrides), []
    except CampaignError as e:
        plan = plan_campaign(path, overrides=overrides, check_files=False)  # raises the problems without files
        made = made_files(plan.campaign)
        if not made:
            raise
        spared = set(local_file_problems(plan.campaign)) - set(local_file_problems(_set_aside(plan.campaign, made)))
        rest = [line for line in e.lines if line not in spared]
        if rest:
            raise CampaignError(rest) from None
        return plan, made
