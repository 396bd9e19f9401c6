"""Which experts a layer uses, decided or changed outside llama.cpp's own routing: the early router,
route-ahead, route replay, and cold-expert dropping (the lossy `--drop-cold-experts`).

May import: model, harness.errors, harness.formats.
"""
