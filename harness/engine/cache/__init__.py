"""Which experts stay in memory: the expert cache and its policies, the cache budget, the evictor thread,
and lossless prefetch.

May import: model, native, io, routing, harness.errors.
"""
