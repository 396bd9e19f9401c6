"""`bmoe chat` and `bmoe serve`: their names, help and serve's own flags as values (`ServeFlags`). The command line
is parsed in harness.engine.cli (`parse`, once), which hands these values to the subcommands."""

from __future__ import annotations

from dataclasses import dataclass

NAMES = ("chat", "serve")


@dataclass(frozen=True)
class ServeFlags:
    host: str = "127.0.0.1"
    port: int = 8080
    queue: int = 4  # requests waiting behind the one being answered; one more gets 503
    model_name: str = ""  # the id /v1/models lists ("" = the file's name without .gguf)
    max_body_kb: int = 1024  # a larger request body is refused (413) before it is read
    api_key: str = ""  # --api-key, or BMOE_API_KEY: "" = none asked
    allow_hosts: tuple[str, ...] = ()  # Host header names answered beside the loopback ones and --host
    tokenize_timeout: float = 10.0  # seconds: a prompt that takes longer to tokenize is refused (400)


SERVE_HELP = ("bmoe serve [-m MODEL] [engine flags] [--host 127.0.0.1] [--port 8080] [--queue 4] [--model-name ID] "
              "[--max-body-kb 1024] [--api-key KEY (or BMOE_API_KEY)] [--allow-host NAME ...] [--tokenize-timeout 10] "
              "(no -m: the bundled trained model): "
              "an OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/models, /health, and a "
              "chat page at /)")
CHAT_HELP = ("bmoe chat [-m MODEL] [engine flags]: an interactive terminal chat with live telemetry (no -m: the "
             "bundled trained model, harness/data/models/tiny)")
