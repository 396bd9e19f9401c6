"""Many generations on one loaded engine: conversations (turns), the `--session` JSON-lines protocol, `bmoe chat`,
the OpenAI-compatible `bmoe serve` and its chat page (web/).

May import: model, native, io, routing, cache, stream, guess, config, run, compose (everything in the engine below
it, not cli or diag), harness.__version__, harness.errors, harness.formats.
"""
