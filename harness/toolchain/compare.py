"""Where bmoe's writer (harness.synth) differs from the pinned converter + llama-quantize: for each family of a
real-toolchain build (scripts/real-toolchain-models.sh OUT_DIR), its Q8_0 file beside `make-model` of the same shape
(Q8_0 experts and dense weights), read with gguf's GGUFReader: metadata keys on one side only, values that differ,
tensor names on one side only, types and shapes that differ, alignment and tensor order. Needs no torch (the product's
.venv runs it):

    python -m harness.toolchain.compare OUT_DIR [--markdown]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from harness.toolchain.build import MANIFEST
from harness.toolchain.families import DENSE_FF, EXPERT_FF, FAMILIES, HIDDEN, N_EXPERT, Family

# bmoe's writer's name for each family's architecture, where the family's name is not one
WRITER_ARCH = {"mixtral": "llama", "deepseek3": "deepseek2"}
# keys whose values are per-file facts, not layout (compared by presence only)
PRESENCE_ONLY = ("general.name", "general.size_label", "general.file_type", "tokenizer.ggml.tokens",
                 "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.scores",
                 "tokenizer.chat_template", "general.quantization_version")


@dataclass
class Diff:
    family: str
    only_converter_keys: list[str] = field(default_factory=list)
    only_writer_keys: list[str] = field(default_factory=list)
    values: list[tuple[str, str, str]] = field(default_factory=list)  # key, converter, writer
    only_converter_tensors: list[str] = field(default_factory=list)
    only_writer_tensors: list[str] = field(default_factory=list)
    types: list[tuple[str, str, str]] = field(default_factory=list)  # tensor, converter, writer
    shapes: list[tuple[str, str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _value(f) -> str:
    from gguf import GGUFValueType

    if f.types and f.types[0] == GGUFValueType.ARRAY:
        if len(f.types) > 1 and f.types[1] == GGUFValueType.STRING:
            return f"[{len(f.data)} strings]"
        return str([f.parts[i].tolist()[0] for i in f.data][:8])
    if f.types and f.types[0] == GGUFValueType.STRING:
        return repr(bytes(f.parts[-1]).decode(errors="replace"))
    v = f.parts[-1].tolist()[0]
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def read(path: Path) -> tuple[dict[str, str], dict[str, tuple[str, tuple[int, ...], int]], int]:
    from gguf import GGUFReader

    r = GGUFReader(path)
    kv = {f.name: _value(f) for f in r.fields.values() if not f.name.startswith("GGUF.")}
    tensors = {t.name: (t.tensor_type.name, tuple(int(x) for x in t.shape), int(t.data_offset)) for t in r.tensors}
    return kv, tensors, r.alignment


def writer_spec(fam: Family, conv_kv: dict[str, str], n_vocab: int):
    from harness.synth import ModelSpec

    kw = fam.kwargs
    arch = WRITER_ARCH.get(fam.name, fam.name)
    n_layer = int(kw.get("num_hidden_layers", 2))
    k = kw.get("num_experts_per_tok", kw.get("moe_k", (kw.get("moe_topk") or [2])[0]))
    params = (("n_nextn", 0),) if arch == "glm4moe" else ()
    return ModelSpec(arch=arch, n_layer=n_layer, n_expert=N_EXPERT, n_expert_used=k, n_embd=HIDDEN, n_ff_exp=EXPERT_FF,
                     n_ff=int(kw.get("intermediate_size_mlp", kw.get("intermediate_size", DENSE_FF))),
                     arch_params=params,
                     n_ff_shexp=int(kw.get("shared_expert_intermediate_size", EXPERT_FF)),
                     n_head=kw["num_attention_heads"], n_head_kv=kw["num_key_value_heads"],
                     head_dim=int(kw.get("head_dim", 64)), n_vocab=max(n_vocab, 300), expert_type="q8_0",
                     dense_type="q8_0", seed=fam.seed, ctx_len=int(conv_kv.get(f"{fam.arch}.context_length", 4096)),
                     rope_freq_base=float(conv_kv.get(f"{fam.arch}.rope.freq_base", 1e6)))


def compare(family: str, conv: Path, writer: Path) -> Diff:
    d = Diff(family)
    ck, ct, ca = read(conv)
    wk, wt, wa = read(writer)
    d.only_converter_keys = sorted(set(ck) - set(wk))
    d.only_writer_keys = sorted(set(wk) - set(ck))
    d.values = [(k, ck[k], wk[k]) for k in sorted(set(ck) & set(wk)) if k not in PRESENCE_ONLY and ck[k] != wk[k]]
    d.only_converter_tensors = sorted(set(ct) - set(wt))
    d.only_writer_tensors = sorted(set(wt) - set(ct))
    both = sorted(set(ct) & set(wt))
    d.types = [(n, ct[n][0], wt[n][0]) for n in both if ct[n][0] != wt[n][0]]
    d.shapes = [(n, str(ct[n][1]), str(wt[n][1])) for n in both if ct[n][1] != wt[n][1]]
    if ca != wa:
        d.notes.append(f"alignment {ca} (converter) vs {wa} (writer)")
    corder = [n for n in sorted(ct, key=lambda n: ct[n][2]) if n in wt]
    worder = [n for n in sorted(wt, key=lambda n: wt[n][2]) if n in ct]
    if corder != worder:
        d.notes.append(f"tensor order differs (converter starts {corder[:3]}, writer {worder[:3]})")
    return d


def _short(names: list[str]) -> str:
    """Layer-generic names: blk.<i>. collapsed, so one line stands for every layer."""
    out = sorted({re.sub(r"^blk\.\d+\.", "blk.N.", n) for n in names})
    return ", ".join(f"`{n}`" for n in out)


def markdown(d: Diff) -> str:
    lines = [f"### {d.family}", ""]
    if d.only_converter_keys:
        lines.append(f"- keys only the converter writes: {', '.join(f'`{k}`' for k in d.only_converter_keys)}")
    if d.only_writer_keys:
        lines.append(f"- keys only the writer writes: {', '.join(f'`{k}`' for k in d.only_writer_keys)}")
    for k, c, w in d.values:
        lines.append(f"- `{k}`: converter {c}, writer {w}")
    if d.only_converter_tensors:
        lines.append(f"- tensors only in the converter's file: {_short(d.only_converter_tensors)}")
    if d.only_writer_tensors:
        lines.append(f"- tensors only in the writer's file: {_short(d.only_writer_tensors)}")
    seen: set[tuple[str, str, str]] = set()
    for n, c, w in d.types:
        key = (re.sub(r"^blk\.\d+\.", "blk.N.", n), c, w)
        if key not in seen:
            seen.add(key)
            lines.append(f"- type of `{key[0]}`: converter {c}, writer {w}")
    for n, c, w in d.shapes:
        key = (re.sub(r"^blk\.\d+\.", "blk.N.", n), c, w)
        if key not in seen:
            seen.add(key)
            lines.append(f"- shape of `{key[0]}`: converter {c}, writer {w}")
    lines += [f"- {n}" for n in d.notes]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.toolchain.compare")
    ap.add_argument("out", type=Path, help="a real-toolchain build folder (its models.json)")
    ap.add_argument("--quant", default="Q8_0")
    a = ap.parse_args(argv)
    from harness.synth import make_model

    man = json.loads((a.out / MANIFEST).read_text())
    with tempfile.TemporaryDirectory() as tmp:
        for name, e in man["families"].items():
            conv = a.out / e["files"][a.quant]
            ck, _, _ = read(conv)
            n_vocab = int(ck["tokenizer.ggml.tokens"].strip("[]").split()[0])
            try:
                wpath = make_model(Path(tmp) / f"{name}.gguf", writer_spec(FAMILIES[name], ck, n_vocab))[0]
            except Exception as ex:  # the writer refuses the shape: that is the difference
                print(f"### {name}\n\n- the writer refuses this shape: {ex}\n")
                continue
            print(markdown(compare(name, conv, wpath)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
