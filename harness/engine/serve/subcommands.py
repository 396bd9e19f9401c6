"""`bmoe chat` and `bmoe serve`: their own flags split from the engine's, which `parse_cli` then reads."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from harness.engine.config import EngineConfig, parse_cli
from harness.errors import UserError

NAMES = ("chat", "serve")


@dataclass(frozen=True)
class ServeFlags:
    host: str = "127.0.0.1"
    port: int = 8080
    queue: int = 4  # requests waiting behind the one being answered; one more gets 503
    model_name: str = ""  # the id /v1/models lists ("" = the file's name without .gguf)


def _serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bmoe serve", add_help=False, allow_abbrev=False)
    p.add_argument("--host", default=ServeFlags.host)
    p.add_argument("--port", type=int, default=ServeFlags.port)
    p.add_argument("--queue", type=int, default=ServeFlags.queue)
    p.add_argument("--model-name", default="")
    return p


SERVE_HELP = ("bmoe serve -m MODEL [engine flags] [--host 127.0.0.1] [--port 8080] [--queue 4] [--model-name ID]: "
              "an OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/models, /health, and a "
              "chat page at /)")
CHAT_HELP = "bmoe chat -m MODEL [engine flags]: an interactive terminal chat with live telemetry"


def split(argv: list[str]) -> tuple[str | None, list[str], ServeFlags]:
    """(subcommand or None, the engine's flags, the server's flags)."""
    if not argv or argv[0] not in NAMES:
        return None, argv, ServeFlags()
    name, rest = argv[0], argv[1:]
    if name == "chat":
        return name, rest, ServeFlags()
    ns, rest = _serve_parser().parse_known_args(rest)
    if not 0 <= ns.port <= 65535:
        raise UserError(f"bmoe serve: --port must be 0..65535, got {ns.port}")
    if ns.queue < 0:
        raise UserError(f"bmoe serve: --queue must be >= 0, got {ns.queue}")
    return name, rest, ServeFlags(ns.host, ns.port, ns.queue, ns.model_name)


def parse(argv: list[str]) -> tuple[str | None, EngineConfig, ServeFlags]:
    name, rest, sf = split(argv)
    if name and any(a in ("-h", "--help") for a in rest):
        print(CHAT_HELP if name == "chat" else SERVE_HELP + "; --queue 0 answers one request at a time, refusing "
              "the rest", "\nengine flags:", flush=True)  # then the engine's own --help
    cfg = parse_cli(rest)
    if name and cfg.session:
        raise UserError(f"bmoe {name}: --session is its own mode; drop it")
    return name, cfg, sf
