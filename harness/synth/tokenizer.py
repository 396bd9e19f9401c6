"""A byte-level SentencePiece ("llama") vocabulary and a ChatML template (pure).

Ids 0..4 are <unk>, <s>, </s>, <|im_start|>, <|im_end|>; then the 256 `<0xXX>` byte tokens, so any text
tokenizes (byte fallback); the rest are ordinary pieces ("▁" word starts, letters, letter pairs) that give the
SPM merger something to merge. Control tokens get a zero output row in the weights (see plan.py), so greedy
decoding never ends early on EOS.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from itertools import product

# llama.cpp token types (llama_token_type)
TYPE_NORMAL = 1
TYPE_UNKNOWN = 2
TYPE_CONTROL = 3
TYPE_BYTE = 6

UNK_ID, BOS_ID, EOS_ID, IM_START_ID, IM_END_ID = 0, 1, 2, 3, 4
SPECIALS: tuple[tuple[str, int], ...] = (
    ("<unk>", TYPE_UNKNOWN),
    ("<s>", TYPE_CONTROL),
    ("</s>", TYPE_CONTROL),
    ("<|im_start|>", TYPE_CONTROL),
    ("<|im_end|>", TYPE_CONTROL),
)
N_BYTE_TOKENS = 256
FIRST_NORMAL_ID = len(SPECIALS) + N_BYTE_TOKENS

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class Vocab:
    tokens: list[str]
    scores: list[float]
    types: list[int]

    @property
    def control_ids(self) -> list[int]:
        """Tokens that must never win greedy decoding (their output rows are zero)."""
        return [i for i, t in enumerate(self.types) if t in (TYPE_CONTROL, TYPE_UNKNOWN)]


def _normal_pieces() -> list[str]:
    """Ordinary pieces, most useful first; deterministic and unique, as many as any vocab asks for."""
    lower = string.ascii_lowercase
    out = ["▁"]
    out += ["▁" + c for c in lower]
    out += list(string.ascii_letters + string.digits + string.punctuation)
    out += ["".join(p) for p in product(lower, repeat=2)]
    out += ["▁" + "".join(p) for p in product(lower, repeat=2)]
    return out


def build_vocab(n_vocab: int) -> Vocab:
    if n_vocab < FIRST_NORMAL_ID:
        raise ValueError(f"n_vocab {n_vocab} < {FIRST_NORMAL_ID}")
    tokens = [s for s, _ in SPECIALS]
    types = [t for _, t in SPECIALS]
    tokens += [f"<0x{b:02X}>" for b in range(N_BYTE_TOKENS)]
    types += [TYPE_BYTE] * N_BYTE_TOKENS
    n_normal = n_vocab - FIRST_NORMAL_ID
    pieces = _normal_pieces()
    i = 0
    while len(pieces) < n_normal:  # beyond ~1500 pieces: three-letter pieces, generated on demand
        pieces.append(_three_letters(i))
        i += 1
    tokens += pieces[:n_normal]
    types += [TYPE_NORMAL] * n_normal
    # SPM merges the pair whose result scores highest: longer pieces score higher, then earlier ones
    scores = [0.0] * FIRST_NORMAL_ID + [float(len(p)) - j * 1e-4 for j, p in enumerate(pieces[:n_normal])]
    return Vocab(tokens=tokens, scores=scores, types=types)


def _three_letters(i: int) -> str:
    a = string.ascii_lowercase
    return "▁" + a[(i // 676) % 26] + a[(i // 26) % 26] + a[i % 26] + ("" if i < 17576 else str(i // 17576))
