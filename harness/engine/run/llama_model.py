"""The first step of a run's wiring order (harness.engine.compose): llama.cpp's model loaded from the file, with no
context yet. The streaming parts are built from it next, and the `Session` (harness.engine.run.session) makes the
context over it with their hook as the eval callback (fixed per context). Also llama.cpp's log, kept for a failed
step's message, and `EngineError`, a failure inside the engine."""

from __future__ import annotations

import ctypes
import time
from collections import deque
from dataclasses import dataclass

from harness.engine.config import EngineConfig
from harness.engine.io import lazymap, sysstats
from harness.engine.model.gguf_layout import ModelLayout
from harness.engine.model.prompt import Prompt, build_prompt
from harness.errors import EngineFailed, UserError
from harness.formats.metrics_csv import UNMEASURED
from harness.formats.partial_import import submodule_alone


class EngineError(EngineFailed, RuntimeError):
    """A failure inside the engine (not the user's input): exit 3."""


# llama.cpp's log lines, the last 50 (for a failed load's message). The callback is made once and kept for the
# process's life: llama.cpp keeps the pointer after a session closes, and a freed one crashes the next load in
# this process (an in-process llama-cpp-python Llama after a Session did: tests/gates/test_bailingmoe3.py)
_LOG_LINES: deque[str] = deque(maxlen=50)
_LOG_CB = None


def _on_log(level, text, _ud) -> None:
    try:
        s = text.decode("utf-8", "replace").strip()
        if s:
            _LOG_LINES.append(s)
    except Exception:  # noqa: BLE001 - never raise into C
        pass


def _log_callback(L):
    global _LOG_CB
    if _LOG_CB is None:
        _LOG_CB = L.llama_log_callback(_on_log)
    return _LOG_CB


def log_lines() -> list[str]:
    """llama.cpp's last 50 log lines, oldest first."""
    return list(_LOG_LINES)


def last_log() -> str:
    """llama.cpp's last error line, else its last line ("" before any)."""
    for s in reversed(_LOG_LINES):
        if "error" in s.lower() or "failed" in s.lower():
            return s
    return _LOG_LINES[-1] if _LOG_LINES else ""


@dataclass(frozen=True)
class LoadFacts:
    """What `llama_model_load_from_file` cost: bytes this process read from storage meanwhile (/proc/self/io
    read_bytes; page-cache hits are not reads; -1 where unreadable), its wall time, and how the file was mapped."""

    read_bytes: int
    seconds: float
    mode: lazymap.LoadMode

    def preamble(self) -> dict[str, object]:
        return {"load_read_bytes": self.read_bytes, "load_model_ms": round(self.seconds * 1e3, 3),
                "load_populate": int(self.mode.populate), "load_populate_note": self.mode.note}


class LoadedModel:
    """llama.cpp's model, loaded (`load`: what that cost) and not yet given a context; the prompt built from the
    file's header before the slow load (a template that cannot do what was asked is refused first). The `Session`
    made over it owns it from then (its close frees the model); `close` frees it before that."""

    def __init__(self, cfg: EngineConfig, layout: ModelLayout):
        L = submodule_alone("llama_cpp.llama_cpp")  # the ctypes bindings, without the package's __init__

        self.L, self.cfg, self.layout = L, cfg, layout
        self.model = None
        _LOG_LINES.clear()
        self.prompt: Prompt = build_prompt(cfg.model, layout.chat_template, cfg.prompt, chatml=cfg.chatml,
                                           no_think=cfg.no_think)
        L.llama_log_set(_log_callback(L), ctypes.c_void_p(0))
        L.llama_backend_init()
        self.t0 = time.perf_counter()  # the load's start: Session.load_s runs from here to its context made
        try:
            self._load()
        except BaseException:
            self.close()
            raise

    def _load(self) -> None:
        L = self.L
        mp = L.llama_model_default_params()
        mp.load_mode = 1  # LLAMA_LOAD_MODE_MMAP
        mp.lazy_mode = 0  # LLAMA_LAZY_MODE_OFF: expert tensors must be plain CPU tensors we can rebind
        mp.use_extra_bufts = False  # repacked Q4_0/Q4_K layouts would break rebinding (non-finite logits)
        mp.check_tensors = False  # validation would read every tensor, experts included, through the mapping
        mp.n_gpu_layers = 0
        mp.load_mtp = self.cfg.mtp  # the nextn (MTP) block's tensors, for harness.engine.guess.mtp
        self._kv = None
        if self.cfg.n_expert_used:
            arr = (L.llama_model_kv_override * 2)()
            arr[0].tag = L.LLAMA_KV_OVERRIDE_TYPE_INT
            arr[0].key = f"{self.layout.arch}.expert_used_count".encode()
            arr[0].value.val_i64 = self.cfg.n_expert_used
            arr[1].key = b""
            self._kv = arr  # must stay alive during load
            mp.kv_overrides = ctypes.cast(arr, ctypes.POINTER(L.llama_model_kv_override))
        io0, t0 = sysstats.proc_io_read_bytes(), time.perf_counter()
        with lazymap.unpopulated(list(self.layout.shards),
                                 lazymap.wants_populate(self.cfg.load_populate, self.cfg.moe_stream)) as mode:
            self.model = L.llama_model_load_from_file(str(self.layout.shards[0]).encode(), mp)
        io1 = sysstats.proc_io_read_bytes()
        self.load = LoadFacts(io1 - io0 if io0 >= 0 and io1 >= 0 else UNMEASURED, time.perf_counter() - t0, mode[0])
        if not self.model:
            raise EngineError(f"llama.cpp could not load {self.cfg.model}: {last_log()}")
        self.vocab = L.llama_model_get_vocab(self.model)
        guess = "--ngram" if self.cfg.ngram else "--mtp" if self.cfg.mtp else ""
        if guess and (L.llama_model_is_recurrent(self.model) or L.llama_model_is_hybrid(self.model)):
            raise UserError(f"{guess}: {self.cfg.model} keeps a recurrent state, which cannot drop rejected "
                            f"guesses; drop {guess}")

    def close(self) -> None:
        if self.model:
            self.L.llama_model_free(self.model)
            self.model = None
