"""`bmoe-bench`: the harness CLI. Each subcommand lives in its own module under harness/commands/
and exposes `register(app)`; this file only wires them and turns an error (harness.errors) into one red line and its
exit code.

Stays at the root because pyproject.toml's console script `bmoe-bench` names it (harness.bench_cli:main)."""

from __future__ import annotations

import errno
import importlib
import sys

import typer

from harness import __version__
from harness.errors import BmoeError

# one module per concern; each defines register(app: typer.Typer) -> None
COMMAND_MODULES: list[str] = [
    "make_model",
    "devices",
    "deploy",
    "campaign",
    "merge",
    "replay",
    "quality",
    "timeline",
    "check",
    "mincap",
    "realism",
]

app = typer.Typer(
    name="bmoe-bench",
    help="bmoe benchmark and experiment harness: models, campaigns, reports, cache replay.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback(invoke_without_command=True)
def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit."),
) -> None:
    if version:
        typer.echo(f"bmoe-bench {__version__}")
        raise typer.Exit(0)


for _name in COMMAND_MODULES:
    importlib.import_module(f"harness.commands.{_name}").register(app)


def error_line(msg: str) -> None:
    """One line on stderr, red where it is a terminal."""
    if sys.stderr.isatty():
        sys.stderr.write(f"\x1b[31mError:\x1b[0m {msg}\n")
    else:
        sys.stderr.write(f"Error: {msg}\n")


_WHERE_ERRORS = {
    errno.EACCES: "give a path you can write (or read)", errno.EPERM: "give a path you can write (or read)",
    errno.EROFS: "the filesystem is read-only: give a path elsewhere",
    errno.ENOSPC: "free some space there and run the command again",
    errno.EDQUOT: "free some space there and run the command again",
    errno.ENAMETOOLONG: "give a shorter path or name",
}


def main(argv: list[str] | None = None) -> int:
    try:
        rv = app(args=argv, standalone_mode=False)  # typer.Exit(n) and Ctrl-C come back as the return value
    except BmoeError as e:  # a user error, a resource, an interrupt, failed runs: each its own code
        error_line(str(e))
        return e.exit_code
    except KeyboardInterrupt:
        error_line("interrupted")
        return 130
    except typer.Exit as e:
        return e.exit_code
    except OSError as e:  # a destination no command turned into its own line: still one line naming it
        if e.filename is None or e.errno not in _WHERE_ERRORS:
            raise
        error_line(f"{e.filename}: {e.strerror}; {_WHERE_ERRORS[e.errno]}")
        return 28 if e.errno in (errno.ENOSPC, errno.EDQUOT) else 2
    except Exception as e:  # click's usage errors (typer may bundle its own click: match by shape)
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):
            error_line(e.format_message().replace("\n", " ") + " (see bmoe-bench --help)")
            return int(e.exit_code) or 2
        if type(e).__name__ == "Abort":
            error_line("aborted")
            return 130
        raise
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
