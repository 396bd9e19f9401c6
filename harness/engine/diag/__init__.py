"""Measurement tools that nothing in the engine imports: batch exactness of verify batches, the cache-management
profile of the live engine, the page-recycling candidates side by side (recycle_probe), chosen summary keys of a
campaign's runs (summary_keys).

May import: model, native, io, routing, cache, stream, guess, config, run, compose, serve, cli, harness.errors,
harness.formats.
"""
