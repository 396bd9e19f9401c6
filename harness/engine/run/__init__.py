"""One engine run through llama.cpp's public API: the Session (the llama.cpp adapter), the TokenLoop that alone
builds token rows and summaries, teacher-forced scoring against a reference (fidelity.py, with the pure figures of
harness.kld), the telemetry sinks, the engine threads' CPU per generation (thread_clock) and the reclaim-storm verdict.

May import: model, native, io, routing, cache, stream, guess, config, harness.__version__, harness.errors,
harness.formats, harness.kld.
"""
