"""`bmoe chat` and `bmoe serve`: their own flags split from the engine's, which `parse_cli` then reads."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass

from harness.engine.config import EngineConfig, parse_cli
from harness.engine.model import default_model
from harness.errors import UserError

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


def _serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bmoe serve", add_help=False, allow_abbrev=False)
    p.add_argument("--host", default=ServeFlags.host)
    p.add_argument("--port", type=int, default=ServeFlags.port)
    p.add_argument("--queue", type=int, default=ServeFlags.queue)
    p.add_argument("--model-name", default="")
    p.add_argument("--max-body-kb", type=int, default=ServeFlags.max_body_kb)
    p.add_argument("--api-key", default=None)
    p.add_argument("--allow-host", action="append", default=[])
    p.add_argument("--tokenize-timeout", type=float, default=ServeFlags.tokenize_timeout)
    return p


SERVE_HELP = ("bmoe serve [-m MODEL] [engine flags] [--host 127.0.0.1] [--port 8080] [--queue 4] [--model-name ID] "
              "[--max-body-kb 1024] [--api-key KEY (or BMOE_API_KEY)] [--allow-host NAME ...] [--tokenize-timeout 10] "
              "(no -m: the bundled trained model): "
              "an OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/models, /health, and a "
              "chat page at /)")
CHAT_HELP = ("bmoe chat [-m MODEL] [engine flags]: an interactive terminal chat with live telemetry (no -m: the "
             "bundled trained model, harness/data/models/tiny)")


def split(argv: list[str], env: Mapping[str, str] = os.environ) -> tuple[str | None, list[str], ServeFlags]:
    """(subcommand or None, the engine's flags, the server's flags); `env` gives BMOE_API_KEY."""
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
    if ns.max_body_kb < 1:
        raise UserError(f"bmoe serve: --max-body-kb must be >= 1, got {ns.max_body_kb}")
    if not 0 < ns.tokenize_timeout <= 3600:
        raise UserError(f"bmoe serve: --tokenize-timeout must be 0 < S <= 3600 seconds, got {ns.tokenize_timeout}")
    key = ns.api_key if ns.api_key is not None else env.get("BMOE_API_KEY", "")
    if ns.api_key is not None and not key:
        raise UserError("bmoe serve: --api-key is empty; give a key, or drop the flag to serve without one")
    if key and (not key.isprintable() or not key.isascii() or " " in key):
        raise UserError("bmoe serve: the API key must be printable ASCII without spaces (it travels in an HTTP header)")
    hosts = tuple(h.strip() for h in ns.allow_host)
    if any(not h for h in hosts):
        raise UserError("bmoe serve: --allow-host needs a name (or '*' for any Host header)")
    return name, rest, ServeFlags(ns.host, ns.port, ns.queue, ns.model_name, ns.max_body_kb, key, hosts,
                                 ns.tokenize_timeout)


def parse(argv: list[str]) -> tuple[str | None, EngineConfig, ServeFlags]:
    name, rest, sf = split(argv)
    if name and not default_model.has_model_flag(rest) and not any(a in ("-h", "--help") for a in rest):
        rest = ["-m", str(default_model.path()), *rest]  # no -m: the committed trained model
    if name and any(a in ("-h", "--help") for a in rest):
        print(CHAT_HELP if name == "chat" else SERVE_HELP + "; --queue 0 answers one request at a time, refusing "
              "the rest", "\nengine flags:", flush=True)  # then the engine's own --help
    cfg = parse_cli(rest)
    if name and cfg.session:
        raise UserError(f"bmoe {name}: --session is its own mode; drop it")
    return name, cfg, sf
