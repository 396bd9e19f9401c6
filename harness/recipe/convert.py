"""Runs the pinned llama.cpp's own `convert_hf_to_gguf.py` (toolchain venv), with one registration added the way
`convert_hf_to_gguf_update.py` adds a model's: the converter identifies a BPE pre-tokenizer by the sha256 of the
token ids of a fixed text, so a newly trained vocabulary is unknown to it by construction. Where the checkpoint's
pre-tokenizer is exactly Qwen2's (tok.QWEN2_SPLIT + byte-level, NFC), this names it `qwen2`, the pre-tokenizer
llama.cpp implements for that regex; any other unknown tokenizer still fails as the converter makes it fail.
Nothing else of the converter is changed.

    python -m harness.recipe.convert LLAMA_SRC HF_DIR --outfile OUT.gguf --outtype f16
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def is_qwen2_pretokenizer(hf_dir: Path) -> bool:
    from harness.recipe.tok import QWEN2_SPLIT
    spec = json.loads((hf_dir / "tokenizer.json").read_text())
    pre, norm = spec.get("pre_tokenizer") or {}, spec.get("normalizer") or {}
    subs = pre.get("pretokenizers") or []
    return (norm.get("type") == "NFC" and pre.get("type") == "Sequence" and len(subs) == 2
            and subs[0].get("type") == "Split" and subs[0].get("pattern", {}).get("Regex") == QWEN2_SPLIT
            and subs[0].get("behavior") == "Isolated" and subs[1].get("type") == "ByteLevel"
            and subs[1].get("use_regex") is False)


def main(argv: list[str]) -> None:
    src, rest = Path(argv[0]).resolve(), argv[1:]
    sys.path[:0] = [str(src / "gguf-py"), str(src)]
    import convert_hf_to_gguf as conv
    from conversion.base import TextModel

    original = TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            if is_qwen2_pretokenizer(Path(self.dir_model)):
                return "qwen2"
            raise

    TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = [str(src / "convert_hf_to_gguf.py"), *rest]
    conv.main()


if __name__ == "__main__":
    main(sys.argv[1:])
