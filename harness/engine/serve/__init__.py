"""Many generations on one loaded engine: conversations (turns), the `--session` JSON-lines protocol, `bmoe chat`,
the OpenAI-compatible `bmoe serve` and its chat page (web/).

May import: everything in the engine below it (compose included), not cli or diag.
"""
