"""Guess-ahead: prompt lookup (`--ngram`), the model's own MTP head (`--mtp`), and whether this llama.cpp decodes
a verify batch bit-exactly.

May import: model, io, harness.errors, harness.formats.
"""
