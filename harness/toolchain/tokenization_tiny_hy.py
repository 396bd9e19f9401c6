"""A tiktoken-style tokenizer class, as Hunyuan ships one (remote code: copied into the checkpoint folder and named in
tokenizer_config.json's auto_map). The pinned converter's HunYuanMoEModel.set_vocab reads `mergeable_ranks` (token
bytes -> rank) and `special_tokens` (text -> id) from it and rebuilds the merges; this class serves them from the
folder's byte-level BPE tokenizer.json (harness.toolchain.tokenizers.train_bpe), whose ids follow its merge order, so
the ranks are the ids. Encoding and decoding go through that tokenizer.json."""

from __future__ import annotations

import os

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizer


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the printable character standing for each byte -> the byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


class TinyHYTokenizer(PreTrainedTokenizer):
    vocab_files_names = {"vocab_file": "tokenizer.json"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file: str, **kwargs):
        self._tk = Tokenizer.from_file(vocab_file)
        added = {t.content for t in self._tk.get_added_tokens_decoder().values()}
        # in id order: the converter lists merges in mergeable_ranks' order, and llama.cpp ranks merges by that list
        vocab = dict(sorted(self._tk.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1]))
        dec = _byte_decoder()
        self.special_tokens = {t: i for t, i in vocab.items() if t in added}
        self.mergeable_ranks = {bytes(dec[c] for c in t): i for t, i in vocab.items() if t not in added}
        self._id_to_token = {i: t for t, i in vocab.items()}
        super().__init__(**kwargs)

    @property
    def vocab_size(self) -> int:
        return self._tk.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self._tk.get_vocab(with_added_tokens=True)

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return self._tk.encode(text, add_special_tokens=False).tokens

    def _convert_token_to_id(self, token: str) -> int:
        return self._tk.token_to_id(token)

    def _convert_id_to_token(self, index: int) -> str:
        return self._id_to_token[index]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return self._tk.decode([self._tk.token_to_id(t) for t in tokens], skip_special_tokens=False)

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str]:
        path = os.path.join(save_directory, (filename_prefix or "") + "tokenizer.json")
        self._tk.save(path)
        return (path,)
