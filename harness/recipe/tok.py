"""The tokenizer: a byte-level BPE trained with `tokenizers` on the training files only (toolchain venv).

Every byte is a token of the initial alphabet, so no text is ever unknown (byte fallback: text outside the learned
merges falls back to its bytes). The pre-tokenizer is Qwen2's (its split regex, NFC, byte-level), the family's own,
so llama.cpp's `qwen2` pre-tokenizer splits text the same way; the converter is told so (export.py) and a test
checks llama.cpp's tokens against this tokenizer's on held-out text. Special tokens and the chat template are
ChatML's, as Qwen3's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

EOS = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIALS = [EOS, IM_START, IM_END]
# Qwen2's pre-tokenizer split (tokenizer.json of Qwen/Qwen2.5-*, the regex llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN2 uses)
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def chat_text(user: str, assistant: str) -> str:
    """One training sample in the chat template's own form (kept equal to CHAT_TEMPLATE's rendering)."""
    return f"{IM_START}user\n{user}{IM_END}\n{IM_START}assistant\n{assistant}{IM_END}\n"


def train(texts: Iterator[str], vocab: int, out: Path, specials: list[str] | None = None,
          chat_template: str = CHAT_TEMPLATE, max_length: int = 4096):  # -> PreTrainedTokenizerFast
    """Train the BPE and save tokenizer.json, tokenizer_config.json and special_tokens_map.json into `out` (the HF
    checkpoint folder the converter reads); returns the tokenizer. `specials` (EOS first): ChatML's by default."""
    specials = specials or SPECIALS
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tk.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=specials[0], pad_token=specials[0], bos_token=None,
                                   unk_token=None, additional_special_tokens=specials[1:])
    fast.chat_template = chat_template
    fast.model_max_length = max_length
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return fast


def load(folder: Path):  # -> PreTrainedTokenizerFast
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(folder))
