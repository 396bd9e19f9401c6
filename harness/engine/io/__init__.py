"""Bytes between flash and memory: positioned slice reads on parallel lanes (Python and compiled), read groups,
anonymous reservations and page release (or recycling: the page pools of --recycle-pages), where the dense weights
live, the lazy mapping shim, fault injection, the I/O and compute trace recorders, and process/machine readings.

May import: model, native, harness.errors, harness.formats.
"""
