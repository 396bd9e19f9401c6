"""The error kinds, one type each: every CLI catches `BmoeError` once, prints its one-line message and exits with
its `exit_code` (a subtype may declare its own code, beside its reason). A message names the input and what to do.

- `UserError`: what the user gave us is wrong (a flag, a file, a campaign): exit 2.
- `ResourceError`: the machine lacks something the command needs right now (a full disk: formats.files.DiskFull,
  exit 28; a campaign folder another run holds: campaigns.store.FolderBusy, exit 75).
- `Interrupted`: the user stopped the command (Ctrl-C, SIGTERM) and it stopped cleanly: exit 130.
- `RunFailed`: the command ran and some of what it ran failed (a campaign's failed runs): exit 1.
- `EngineFailed`: the engine failed while it ran, not because of the input (llama.cpp refused a load or a decode,
  the streaming hook failed, short reads and EIO on expert reads): exit 3 (harness.engine.run.session.EngineError,
  harness.engine.stream.common.HookError).

Every error the engine or the harness raises to a CLI is one of these (tests/engine/test_wiring.py checks the
engine's); anything else reaching `bmoe` is an internal error (exit 3, a traceback with BMOE_DEBUG=1).

`TraceFormatError` is no CLI error: the trace readers (formats.traces, formats.route_trace) raise it on a
malformed file and turn it into a UserError naming the file.

Stays at the root because every package raises these, harness/formats too (which may import nothing else)."""


class BmoeError(Exception):
    """One line for the user and a non-zero exit; raise one of its kinds below, not this."""

    exit_code = 1


class UserError(BmoeError):
    """A problem with what the user gave us (a flag, a file, a campaign). The message is one line
    naming the input and what to do."""

    exit_code = 2


class ResourceError(BmoeError):
    """Something the command needs is missing on this machine now (disk space, a folder in use): free it or wait,
    and run the command again. Its subtypes declare their exit codes."""

    exit_code = 1


class Interrupted(BmoeError):
    """The user interrupted the command; what finished is kept (the message says how to continue)."""

    exit_code = 130


class RunFailed(BmoeError):
    """The command ran to its end but some of its runs failed (the message says where the reasons are)."""

    exit_code = 1


class EngineFailed(BmoeError):
    """The engine failed while it ran (not the user's input); the message says what failed."""

    exit_code = 3


class TraceFormatError(ValueError):
    """A malformed trace file (io_trace, compute_trace or route trace); its reader turns it into a UserError
    naming the file."""
