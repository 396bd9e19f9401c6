"""The tokenizers the tiny checkpoints ship (toolchain venv), trained here on a fixed generated text so every
machine gets the same vocabulary:

- a byte-level BPE (`tokenizers`) with Qwen2's pre-tokenizer (harness.recipe.tok.QWEN2_SPLIT, NFC, byte-level): the
  converter identifies a BPE pre-tokenizer by the hash of a fixed text's ids, so a new vocabulary is unknown to it by
  construction; harness.recipe.convert names this one `qwen2`, the pre-tokenizer llama.cpp implements for that
  regex. Its special tokens include the ones the GLM converter looks up by name ([gMASK], <|user|>, ...);
- a SentencePiece BPE model (tokenizer.model) for the families whose converter reads one (Mixtral's llama, ERNIE);
- the byte-level BPE behind a tiktoken-style remote-code class (tokenization_tiny_hy.py), as Hunyuan ships its
  tokenizer: its converter reads `mergeable_ranks` from that class.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

EOS = "<|endoftext|>"
SPECIALS = [EOS, "<|im_start|>", "<|im_end|>", "[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<|observation|>",
            "<|startoftext|>", "<unk>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
_WORDS = ("the expert cache keeps hot experts near while cold ones stay on flash and each token routes to a few of "
          "them through a router whose weights pick the top scores model layer reads bytes from the file in pages "
          "lanes direct memory budget evicts policy least recently used markov streamed resident output identical "
          "quantized blocks rows columns tensor shape mixture of small dense attention heads keys values norm").split()


def corpus(n_lines: int = 2000, seed: int = 0) -> list[str]:
    """A fixed text: seeded sentences over a small word list, with numbers and punctuation."""
    rng = random.Random(seed)
    lines = []
    for i in range(n_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
        words[0] = words[0].capitalize()
        lines.append(" ".join(words) + rng.choice([".", "!", "?", ",", ":"]) + f" {i % 97} ({rng.randint(0, 999)})")
    return lines


def train_bpe(out: Path, vocab: int = 512) -> int:
    """tokenizer.json, tokenizer_config.json, special_tokens_map.json into `out`; returns the vocabulary size."""
    from harness.recipe.tok import train

    fast = train(corpus(), vocab, out, specials=SPECIALS, chat_template=CHAT_TEMPLATE, max_length=2048)
    return len(fast)


def train_spm(out: Path, vocab: int = 512) -> int:
    """tokenizer.model (a SentencePiece BPE with byte fallback: <unk>=0, <s>=1, </s>=2, as Llama's) and its
    tokenizer_config.json into `out`; returns the vocabulary size."""
    import io

    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus()), model_writer=buf, vocab_size=vocab,
                                   model_type="bpe", byte_fallback=True, character_coverage=1.0, num_threads=1,
                                   unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.model").write_bytes(buf.getvalue())
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "add_bos_token": True, "add_eos_token": False, "legacy": False, "chat_template": CHAT_TEMPLATE,
    }, indent=1) + "\n")
    proc = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    return proc.get_piece_size()


def train_hy(out: Path, vocab: int = 512) -> int:
    """train_bpe, plus the remote-code tokenizer class Hunyuan's converter loads (trust_remote_code)."""
    n = train_bpe(out, vocab)
    src = Path(__file__).with_name("tokenization_tiny_hy.py")
    (out / src.name).write_text(src.read_text())
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(tokenizer_class="TinyHYTokenizer", auto_map={"AutoTokenizer": ["tokenization_tiny_hy.TinyHYTokenizer",
                                                                              None]})
    cfg_path.write_text(json.dumps(cfg, indent=1) + "\n")
    return n
