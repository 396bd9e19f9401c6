"""One engine run through llama.cpp's public API: the Session (the llama.cpp adapter), the TokenLoop that alone
builds token rows and summaries, the telemetry sinks and the reclaim-storm verdict.

May import: model, native, io, routing, cache, stream, guess, config.
"""
