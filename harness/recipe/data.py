"""The recipe's token streams (toolchain venv): the corpus files and chat samples made from the training files'
reST sections, tokenized, shuffled by document with the seed, joined with <|endoftext|>; saved as uint16 arrays in the
work folder and reused on resume (keyed by the corpus hash and the tokenizer's sha256)."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np

from harness.recipe import corpus, tok


def documents(root: Path, files: list[corpus.CorpusFile], seed: int, chat: bool) -> list[str]:
    docs: list[str] = []
    for f in files:
        text = (root / f.rel).read_text(encoding="utf-8", errors="replace")
        docs.append(text)
        if chat and f.rel.endswith(".rst.txt"):
            docs.extend(tok.chat_text(t, b) for t, b in corpus.sections(text))
    random.Random(seed).shuffle(docs)
    return docs


def encode(tokenizer, docs: list[str]) -> np.ndarray:
    eos = tokenizer.convert_tokens_to_ids(tok.EOS)
    ids: list[int] = []
    for i in range(0, len(docs), 256):
        for row in tokenizer(docs[i:i + 256], add_special_tokens=False)["input_ids"]:
            ids.extend(row)
            ids.append(eos)
    arr = np.asarray(ids, dtype=np.uint16)
    assert int(arr.max()) < 65536
    return arr


def streams(work: Path, root: Path, train: list[corpus.CorpusFile], held: list[corpus.CorpusFile], tok_dir: Path,
            seed: int, key: str) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    tok_sha = hashlib.sha256((tok_dir / "tokenizer.json").read_bytes()).hexdigest()
    stamp = work / "tokens.json"
    want = {"corpus": key, "tokenizer": tok_sha, "seed": seed}
    if stamp.exists() and json.loads(stamp.read_text()).get("key") == want:
        meta = json.loads(stamp.read_text())
        return np.load(work / "train.npy"), np.load(work / "heldout.npy"), meta["counts"]
    tokenizer = tok.load(tok_dir)
    tr_docs = documents(root, train, seed, chat=True)
    he_docs = documents(root, held, seed, chat=False)
    tr, he = encode(tokenizer, tr_docs), encode(tokenizer, he_docs)
    np.save(work / "train.npy", tr)
    np.save(work / "heldout.npy", he)
    counts = {"train_docs": len(tr_docs), "heldout_docs": len(he_docs), "train_tokens": int(tr.size),
              "heldout_tokens": int(he.size)}
    stamp.write_text(json.dumps({"key": want, "counts": counts}, indent=1))
    return tr, he, counts
