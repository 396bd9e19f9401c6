"""The eval-callback hook on llama.cpp's `cb_eval` and its stages: bind (tensors to memory), route (expert ids
at each routing node), weights (the router's final weights, for cold-expert dropping), account (lookups, reads,
evictions, the release of evicted pages), dense, taps (a layer's input for read-ahead) and the compiled front.

May import: model, native, io, routing, cache, harness.errors (the hook's failure is an EngineFailed).
"""
