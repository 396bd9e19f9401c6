"""Feasibility probe, not part of the engine: drive llama.cpp's MTP (nextn) context from Python on the pinned
llama-cpp-python 0.3.36, on a generated model that has a nextn layer:

    bmoe-bench make-model /tmp/glm.gguf --arch glm4moe && python scripts/mtp-probe.py /tmp/glm.gguf

It loads the model with `load_mtp`, makes the trunk's context and an MTP context on the same model
(`ctx_type = LLAMA_CONTEXT_TYPE_MTP`, `ctx_other` = the trunk's), decodes a prompt on the trunk, feeds the MTP
context the prompt's tokens paired with the trunk's hidden states (the position before each), then drafts one
token from the last sampled one and compares it with the trunk's greedy next token (a synthetic model's MTP
head is random: they rarely agree). Everything is in the Python bindings except the two functions that turn
the trunk's hidden-state output on and read it, which llama.cpp declares only in its staging C++ header
(src/llama-ext.h: llama_set_embeddings_nextn, llama_get_embeddings_nextn_ith): they are exported from
libllama.so under their C++ (Itanium) mangled names, which ctypes can call.
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np
from llama_cpp import llama_cpp as L


def mangled(name: str, argtypes: list, restype):
    f = getattr(L._lib, name)
    f.argtypes, f.restype = argtypes, restype
    return f


SET_NEXTN = mangled("_Z26llama_set_embeddings_nextnP13llama_contextbb",
                    [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None)
GET_NEXTN_ITH = mangled("_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
                        [ctypes.c_void_p, ctypes.c_int32], ctypes.POINTER(ctypes.c_float))


def context(model, mtp_of=None):
    cp = L.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = 256
    cp.n_seq_max = 1
    if mtp_of is not None:
        cp.ctx_type, cp.ctx_other, cp.n_rs_seq = L.LLAMA_CONTEXT_TYPE_MTP, mtp_of, 0
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        sys.exit("could not create the context")
    return ctx


def main(path: str) -> None:
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.load_mtp, mp.use_extra_bufts = True, False
    model = L.llama_model_load_from_file(path.encode(), mp)
    if not model or L.llama_model_n_layer_nextn(model) < 1:
        sys.exit(f"{path}: not loadable, or no nextn layer")
    tgt = context(model)
    dft = context(model, mtp_of=tgt)
    SET_NEXTN(tgt, True, False)  # the trunk outputs its hidden state for every token
    SET_NEXTN(dft, True, True)
    vocab = L.llama_model_get_vocab(model)
    nv, n_embd = L.llama_vocab_n_tokens(vocab), L.llama_model_n_embd(model)
    raw = b"The cat sat on the mat."
    arr = (L.llama_token * 64)()
    n = L.llama_tokenize(vocab, raw, len(raw), arr, 64, True, True)
    toks = list(arr[:n])
    assert L.llama_decode(tgt, L.llama_batch_get_one(arr, n)) == 0
    hs = [np.ctypeslib.as_array(GET_NEXTN_ITH(tgt, i), shape=(n_embd,)).copy() for i in range(n)]
    nxt = int(np.ctypeslib.as_array(L.llama_get_logits_ith(tgt, -1), shape=(nv,)).argmax())
    b = L.llama_batch_ext_init(dft)
    keep: list[np.ndarray] = []

    def add(tok: int, pos: int, h: np.ndarray, out: bool) -> int:
        idx = L.llama_batch_ext_add_token(b, 0, tok)
        row = np.ascontiguousarray(h, dtype=np.float32)
        keep.append(row)
        assert L.llama_batch_ext_set_embd_token(b, idx, L.llama_embd(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                                                    1, n_embd))
        assert L.llama_batch_ext_set_pos(b, idx, (L.llama_pos * 1)(pos))
        L.llama_batch_ext_set_output_logits(b, idx, out)
        return idx

    for k in range(1, n):  # the MTP block's KV for the prompt
        add(toks[k], k, hs[k - 1], False)
    print("MTP catch-up llama_process rc", L.llama_process(dft, L.LLAMA_PROCESS_TYPE_DECODE, b))
    L.llama_batch_ext_clear(b)
    keep.clear()
    i = add(nxt, n, hs[n - 1], True)
    print("MTP draft llama_process rc", L.llama_process(dft, L.LLAMA_PROCESS_TYPE_DECODE, b))
    draft = int(np.ctypeslib.as_array(L.llama_get_logits_ith(dft, i), shape=(nv,)).argmax())
    one = (L.llama_token * 1)(nxt)
    assert L.llama_decode(tgt, L.llama_batch_get_one(one, 1)) == 0
    truth = int(np.ctypeslib.as_array(L.llama_get_logits_ith(tgt, -1), shape=(nv,)).argmax())
    print(f"MTP drafted {draft}; the trunk's greedy next token is {truth}")
    L.llama_batch_ext_free(b)
    L.llama_free(dft)
    L.llama_free(tgt)
    L.llama_model_free(model)


if __name__ == "__main__":
    main(sys.argv[1])
