"""Byte-level SentencePiece ("llama") vocabularies and chat templates (pure).

The first ids are the chat format's special tokens: ChatML's (<unk>, <s>, </s>, <|im_start|>, <|im_end|>)
for most archs, harmony's for gpt-oss (see HARMONY), Qwen3's with its <think> pair (see QWEN3) when a model
is made with that template; then the 256 `<0xXX>` byte tokens, so any text tokenizes
(byte fallback); the rest are ordinary pieces ("▁" word starts, letters, letter pairs) that give the SPM
merger something to merge. Control tokens get a zero output row in the weights (see plan.py), so greedy
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
TYPE_USER_DEFINED = 4
TYPE_BYTE = 6

UNK_ID, BOS_ID, EOS_ID, IM_START_ID, IM_END_ID = 0, 1, 2, 3, 4
N_BYTE_TOKENS = 256

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# The harmony format of gpt-oss, written from its public description: every message is
# <|start|>{role}<|message|>{content}<|end|>; a system message first carries the knowledge cutoff, the
# reasoning effort (`reasoning_effort`: low, medium or high; medium by default) and the valid channels; the
# caller's system prompt becomes the developer message's instructions; assistant turns in the history are
# final-channel messages; the generation prompt is <|start|>assistant, after which the model names its own
# channel (analysis first, then final). llama.cpp recognises the format by its <|start|> and <|channel|>
# markers: llama_chat_apply_template then applies its built-in harmony form (no system preamble), while a
# Jinja renderer (llama-cpp-python's chat handlers) renders this template in full.
HARMONY_TEMPLATE = (
    "{%- set effort = reasoning_effort | default('medium') -%}"
    "{{- '<|start|>system<|message|>Knowledge cutoff: 2024-06\\n\\nReasoning: ' + effort + '\\n\\n'"
    " + '# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>' -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] in ('system', 'developer') -%}"
    "{{- '<|start|>developer<|message|># Instructions\\n\\n' + message['content'] + '<|end|>' -}}"
    "{%- elif message['role'] == 'user' -%}"
    "{{- '<|start|>user<|message|>' + message['content'] + '<|end|>' -}}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{- '<|start|>assistant<|channel|>final<|message|>' + message['content'] + '<|end|>' -}}"
    "{%- else -%}"
    "{{- raise_exception('harmony template: unsupported role ' + message['role']) -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}"
)

# A Qwen3-style template, written from the public description of its behaviour: ChatML turns
# (<|im_start|>{role}\n{content}<|im_end|>\n), a leading system message, assistant turns in the history keep only
# the text after their </think> (the reasoning of the turn after the last user message stays, inside
# <think>\n...\n</think>\n\n), and the generation prompt <|im_start|>assistant\n, followed, when the caller passes
# enable_thinking=false, by an empty think block <think>\n\n</think>\n\n so the model answers without reasoning.
# llama_chat_apply_template recognises it by <|im_start|> and applies its ChatML form (no think handling).
QWEN3_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "{%- if not loop.first -%}{{- raise_exception('qwen3 template: the system message must come first') -}}"
    "{%- endif -%}"
    "{%- elif message['role'] == 'user' -%}"
    "{{- '<|im_start|>user\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{%- set content = message['content'] -%}"
    "{%- set reasoning = '' -%}"
    "{%- if '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{%- if loop.index0 > ns.last_user and reasoning -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content + '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- else -%}"
    "{{- raise_exception('qwen3 template: unsupported role ' + message['role']) -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)


@dataclass(frozen=True)
class Specials:
    """A chat format's special tokens (ids 0..n-1 of the vocab, in this order) and its template."""

    tokens: tuple[tuple[str, int], ...]  # (text, llama_token_type)
    unk_id: int
    bos_id: int
    eos_id: int
    add_bos: bool
    template: str


CHATML = Specials(
    (
        ("<unk>", TYPE_UNKNOWN),
        ("<s>", TYPE_CONTROL),
        ("</s>", TYPE_CONTROL),
        ("<|im_start|>", TYPE_CONTROL),
        ("<|im_end|>", TYPE_CONTROL),
    ),
    UNK_ID,
    BOS_ID,
    EOS_ID,
    True,
    CHATML_TEMPLATE,
)

# gpt-oss's o200k_harmony specials by name (the real ids are 199998..200012); eos is <|return|>, as in the
# published GGUFs. With <|return|> and <|call|> present llama.cpp drops <|end|> from the end-of-generation set.
HARMONY = Specials(
    (
        ("<unk>", TYPE_UNKNOWN),
        ("<|startoftext|>", TYPE_CONTROL),
        ("<|endoftext|>", TYPE_CONTROL),
        ("<|return|>", TYPE_CONTROL),
        ("<|constrain|>", TYPE_CONTROL),
        ("<|channel|>", TYPE_CONTROL),
        ("<|start|>", TYPE_CONTROL),
        ("<|end|>", TYPE_CONTROL),
        ("<|message|>", TYPE_CONTROL),
        ("<|call|>", TYPE_CONTROL),
    ),
    0,
    1,
    3,
    False,
    HARMONY_TEMPLATE,
)


# Qwen3's specials (the real ids are 151643..151668): eos is <|im_end|>, no BOS, as in the published GGUFs; <think>
# and </think> are user-defined tokens (matched whole in text, generated like any other piece), not control ones.
QWEN3 = Specials(
    (
        ("<unk>", TYPE_UNKNOWN),
        ("<|endoftext|>", TYPE_CONTROL),
        ("<|im_start|>", TYPE_CONTROL),
        ("<|im_end|>", TYPE_CONTROL),
        ("<think>", TYPE_USER_DEFINED),
        ("</think>", TYPE_USER_DEFINED),
    ),
    0,
    1,
    3,
    False,
    QWEN3_TEMPLATE,
)

# `make-model --chat-template NAME`: the template (and the special tokens it needs) a model carries; "none"
# writes no tokenizer.chat_template (the vocab is the arch's default one)
TEMPLATES: dict[str, Specials | None] = {"chatml": CHATML, "harmony": HARMONY, "qwen3": QWEN3, "none": None}


def default_template(arch: str) -> str:
    return "harmony" if arch == "gpt-oss" else "chatml"


def specials_for(arch: str, template: str = "") -> Specials:
    """The special tokens of the model's vocab: those of its template ("" = the arch's default one)."""
    sp = TEMPLATES.get(template or default_template(arch))
    return sp if sp is not None else TEMPLATES[default_template(arch)]  # type: ignore[return-value]


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


def build_vocab(n_vocab: int, specials: Specials = CHATML) -> Vocab:
    first_normal = len(specials.tokens) + N_BYTE_TOKENS
    if n_vocab < first_normal:
        raise ValueError(f"n_vocab {n_vocab} < {first_normal}")
    tokens = [s for s, _ in specials.tokens]
    types = [t for _, t in specials.tokens]
    tokens += [f"<0x{b:02X}>" for b in range(N_BYTE_TOKENS)]
    types += [TYPE_BYTE] * N_BYTE_TOKENS
    n_normal = n_vocab - first_normal
    pieces = _normal_pieces()
    i = 0
    while len(pieces) < n_normal:  # beyond ~1500 pieces: three-letter pieces, generated on demand
        pieces.append(_three_letters(i))
        i += 1
    tokens += pieces[:n_normal]
    types += [TYPE_NORMAL] * n_normal
    # SPM merges the pair whose result scores highest: longer pieces score higher, then earlier ones
    scores = [0.0] * first_normal + [float(len(p)) - j * 1e-4 for j, p in enumerate(pieces[:n_normal])]
    return Vocab(tokens=tokens, scores=scores, types=types)


def _three_letters(i: int) -> str:
    a = string.ascii_lowercase
    return "▁" + a[(i // 676) % 26] + a[(i // 26) % 26] + a[i % 26] + ("" if i < 17576 else str(i // 17576))
