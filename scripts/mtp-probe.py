"""Feasibility probe: llama.cpp's MTP context from Python on the pinned llama-cpp-python 0.3.36."""
import ctypes, sys
import numpy as np
from llama_cpp import llama_cpp as L
path = sys.argv[1].encode()
L.llama_backend_init()
mp = L.llama_model_default_params(); mp.load_mtp = True; mp.use_extra_bufts = False
model = L.llama_model_load_from_file(path, mp)
print("n_layer_nextn", L.llama_model_n_layer_nextn(model))
lib = L._lib
def mangled(name, argtypes, restype):
    f = getattr(lib, name); f.argtypes = argtypes; f.restype = restype; return f
set_nextn = mangled("_Z26llama_set_embeddings_nextnP13llama_contextbb", [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None)
get_nextn_ith = mangled("_Z30llama_get_embeddings_nextn_ithP13llama_contexti", [ctypes.c_void_p, ctypes.c_int32], ctypes.POINTER(ctypes.c_float))
cp = L.llama_context_default_params(); cp.n_ctx = 256; cp.n_batch = 256; cp.n_ubatch = 256; cp.n_seq_max = 1
tgt = L.llama_init_from_model(model, cp)
cp2 = L.llama_context_default_params(); cp2.n_ctx = 256; cp2.n_batch = 256; cp2.n_ubatch = 256; cp2.n_seq_max = 1
cp2.ctx_type = L.LLAMA_CONTEXT_TYPE_MTP; cp2.ctx_other = tgt; cp2.n_rs_seq = 0
dft = L.llama_init_from_model(model, cp2)
print("target ctx", bool(tgt), "mtp ctx", bool(dft))
set_nextn(tgt, True, False); set_nextn(dft, True, True)
vocab = L.llama_model_get_vocab(model)
raw = b"The cat sat on the mat."
arr = (L.llama_token * 64)(); n = L.llama_tokenize(vocab, raw, len(raw), arr, 64, True, True)
toks = list(arr[:n])
tarr = (L.llama_token * n)(*toks)
rc = L.llama_decode(tgt, L.llama_batch_get_one(tarr, n))
n_embd = L.llama_model_n_embd(model)
h = np.ctypeslib.as_array(get_nextn_ith(tgt, n - 1), shape=(n_embd,)).copy()
print("target decode rc", rc, "h_nextn row", h[:4])
# the MTP step: (the sampled token, the trunk's hidden state of the position before it) through the nextn block
nxt = int(np.ctypeslib.as_array(L.llama_get_logits_ith(tgt, -1), shape=(L.llama_vocab_n_tokens(vocab),)).argmax())

nv = L.llama_vocab_n_tokens(vocab)
hs = [np.ctypeslib.as_array(get_nextn_ith(tgt, i), shape=(n_embd,)).copy() for i in range(n)]
# catch-up: the MTP block's KV for the prompt: token k paired with the trunk's hidden state at k-1
b = L.llama_batch_ext_init(dft)
keep = []
def add(tok, pos, h, out):
    idx = L.llama_batch_ext_add_token(b, 0, tok)
    row = np.ascontiguousarray(h, dtype=np.float32); keep.append(row)
    e = L.llama_embd(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, n_embd)
    assert L.llama_batch_ext_set_embd_token(b, idx, e)
    p = (L.llama_pos * 1)(pos); assert L.llama_batch_ext_set_pos(b, idx, p)
    L.llama_batch_ext_set_output_logits(b, idx, out)
    return idx
for k in range(1, n):
    add(toks[k], k, hs[k - 1], False)
print("mtp catch-up rc", L.llama_process(dft, L.LLAMA_PROCESS_TYPE_DECODE, b))
L.llama_batch_ext_clear(b); keep.clear()
i = add(nxt, n, hs[n - 1], True)
print("mtp draft rc", L.llama_process(dft, L.LLAMA_PROCESS_TYPE_DECODE, b))
draft = int(np.ctypeslib.as_array(L.llama_get_logits_ith(dft, i), shape=(nv,)).argmax())
tarr2 = (L.llama_token * 1)(nxt)
L.llama_decode(tgt, L.llama_batch_get_one(tarr2, 1))
truth = int(np.ctypeslib.as_array(L.llama_get_logits_ith(tgt, -1), shape=(nv,)).argmax())
print("MTP drafted", draft, "the trunk's greedy token", truth)
