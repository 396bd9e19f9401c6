"""One engine run through llama.cpp's public API: the Session (the llama.cpp adapter), the TokenLoop that alone
builds token rows and summaries, teacher-forced scoring against a reference (fidelity.py, with the pure figures of
harness.kld), the telemetry sinks and the reclaim-storm verdict.

May import: model, native, io, routing, cache, stream, guess, config.
"""
