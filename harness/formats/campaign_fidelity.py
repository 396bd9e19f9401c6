"""A campaign's `fidelity:` section, declared once (FidelitySpec; harness.formats.campaign includes it): the text
every scored cell is evaluated on and the reference's knobs; and the manifest's records of it (FidelityRecord in
the plan, FidelityRef for the reference run). The runner makes the reference once per campaign (`bmoe
--fidelity-ref`, the base cell's flags plus `flags`) and scores the chosen cells against it (`bmoe
--fidelity-against`) beside their speed runs; what is scored is harness.campaigns.fidelity's."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from harness.formats.campaign_types import Flags, FlagValue
from harness.formats.folder import FIDELITY_REF, FIDELITY_REF_LOG
from harness.formats.raw_hashes import only_names
from harness.formats.record import Record


class FidelitySpec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    text: str | None = Field(None, description="the text scored teacher-forced (give text or text_file)")
    text_file: str | None = Field(None, description=(
        "or a UTF-8 text file (relative: from the campaign's folder; campaigns/fidelity-text.txt is shipped)"))
    ctx: int = Field(128, ge=8, description="context size of every chunk (-c of the reference and every scoring)")
    chunks: int = Field(0, ge=0, description="score the text's first N chunks (0: every whole chunk); at least 2 "
                                             "are needed for an interval over chunks")
    top_k: int = Field(256, ge=0, description="the reference keeps each position's top K log-probabilities "
                                              "(0: the whole vocabulary, exact)")
    flags: Flags = Field(default_factory=dict, description=(
        "the reference's knobs, added to the base cell's flags (they must be lossless), e.g. {--n-expert-used: 0}"))
    python_engine: bool = Field(False, description=(
        "true when the campaign's external engine is the Python engine (over adb: a script running `python -m "
        "harness.engine.cli` on the device); the C++ bmoe-cli has no logits output and cannot be scored"))
    cells: Literal["lossy", "all"] = Field("lossy", description=(
        "which cells are scored: lossy (a lossy knob differs from the reference's) or all (lossless ones give 0)"))
    decode: bool = Field(False, description=(
        "score one token at a time (bmoe --fidelity-decode), as generation decodes, so decode-time knobs "
        "(--drop-cold-experts, --route-ahead, prefetch) act while scoring; the findings then add held-out "
        "perplexity and next-token accuracy per cell"))

    def problems(self) -> list[tuple[tuple[str | int, ...], str]]:
        if (self.text is None) == (self.text_file is None):
            return [(("fidelity",), "fidelity needs exactly one of text (inline) or text_file (a text file)")]
        if self.text is not None and not self.text.strip():
            return [(("fidelity", "text"), "fidelity.text is empty")]
        return []


class FidelityRecord(Record):
    """A campaign's fidelity scoring, fixed before the first run (hashed with the plan;
    harness.campaigns.fidelity)."""

    text_sha256: str  # of the text as scored (UTF-8)
    text_chars: int
    text_file: str | None  # as the campaign file gave it (None: inline text)
    ctx: int
    chunks: int
    top_k: int
    flags: dict[str, FlagValue]  # the reference's own knobs, added to the base cell's
    cells: str  # lossy or all
    scored: list[int]  # the cells scored against the reference, by index
    drop_in_prefill_added: list[int] = []  # cells with a non-zero drop rule, scored with --drop-in-prefill added
    decode: bool = False  # scored one token at a time (set only when true: older plans hash the same)


class FidelityRef(Record):
    """The campaign's reference run (`bmoe --fidelity-ref`), made once before the first run; its files
    (FIDELITY_REF, FIDELITY_REF_LOG beside the manifest) hashed when it ended."""

    status: Literal["ok", "failed"]
    reason: str | None
    argv: list[str]
    start: str
    wall_s: float
    sha256: dict[str, str]  # file name (in the campaign folder) -> sha256
    _names = field_validator("sha256")(only_names((FIDELITY_REF, FIDELITY_REF_LOG)))  # never a path elsewhere
