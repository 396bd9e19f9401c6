"""The files a run is given: checked before anything is read or the slow load starts, and a write that fails
later named by its flag and path.

Inputs (the model, --prompts-file, --route-replay, --drop-replay, --fidelity-against) must be regular files: a
FIFO would block the header read for ever, /dev/zero would be read until memory runs out, /proc/self/mem
answers EIO. Outputs (the flags declared `writes`, and --fidelity-ref and --fidelity-csv) need an existing
directory; a write refused by permissions, a read-only filesystem or a full disk is one line naming the flag
and the path (a full disk is `DiskFull`, exit 28, as everywhere in bmoe)."""

from __future__ import annotations

import errno
import os
import stat

from harness.engine.config import SPECS, EngineConfig
from harness.errors import BmoeError, UserError
from harness.formats.files import DiskFull, free_bytes, is_disk_full, mib

INPUTS = ("prompts_file", "route_replay", "drop_replay", "fidelity_against")  # besides the model
EXTRA_OUTPUTS = ("fidelity_ref", "fidelity_csv")  # written, but not declared `writes` (no directory check before)
TRACE_MAX_BYTES = 4 << 30  # an input read whole into memory (a route trace): refused beyond this


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def check_model_file(path: str) -> None:
    if not os.path.exists(path):
        raise UserError(f"{path}: no such model file; check the -m path")
    if os.path.isdir(path):
        raise UserError(f"{path}: is a directory; pass the .gguf file (first shard of a split model)")
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise UserError(f"-m {path}: is {_kind(mode)}, not a model file; pass the .gguf file")
    if not os.access(path, os.R_OK):
        raise UserError(f"{path}: permission denied; make the model file readable (chmod a+r)")
    if os.path.getsize(path) == 0:
        raise UserError(f"-m {path}: is empty (0 bytes); pass the .gguf file")


def check_input_files(cfg: EngineConfig) -> None:
    """Every input PATH but the model: a regular file of a size that can be read, or one line, exit 2."""
    for s in SPECS:
        path = getattr(cfg, s.name) if s.name in INPUTS else None
        if not path:
            continue
        try:
            st = os.stat(path)
        except OSError as e:
            raise UserError(f"{s.label} {path}: cannot read it ({e.strerror}); give an existing file") from None
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{s.label} {path}: is {_kind(st.st_mode)}; give a regular file")
        if st.st_size > TRACE_MAX_BYTES:
            raise UserError(f"{s.label} {path}: {st.st_size / 2**30:.1f} GiB, more than the "
                            f"{TRACE_MAX_BYTES >> 30} GiB bmoe reads whole; give a shorter file")


def check_output_paths(cfg: EngineConfig) -> None:
    """Every PATH the run will write (the flags declared `writes`, the fidelity outputs), checked before the slow
    load: its directory must exist (nothing is created for it) and the path must be a file or nothing yet (not a
    directory, a device or a FIFO: /dev/full was replaced by a file). One line, exit 2."""
    for s in SPECS:
        path = getattr(cfg, s.name) if s.flag.writes or s.name in EXTRA_OUTPUTS else None
        if not path:
            continue
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            what = "is not a directory" if os.path.exists(parent) else "does not exist"
            raise UserError(f"{s.label} {path}: its directory {parent} {what}; create it first or write elsewhere")
        if os.path.isdir(path):
            raise UserError(f"{s.label} {path}: is a directory; give a file path")
        # a device or FIFO: written into it, or (a file written whole, then renamed over it) replaced by a file
        if os.path.exists(path) and not os.path.isfile(path):
            raise UserError(f"{s.label} {path}: is {_kind(os.stat(path).st_mode)}, not a file; give a file path")


def label_of(cfg: EngineConfig, path: object) -> str:
    """The flag that named this output path ("" when none did)."""
    for s in SPECS:
        if (s.flag.writes or s.name in EXTRA_OUTPUTS) and getattr(cfg, s.name) and \
                os.path.abspath(str(getattr(cfg, s.name))) == os.path.abspath(str(path)):
            return s.label
    return ""


def write_error(label: str, path: object, e: OSError) -> BmoeError:
    """A failed write of an output as one line naming the flag and the path."""
    where = f"{label} {path}".strip()
    if is_disk_full(e):
        free = f" ({mib(free_bytes(str(path)))} free there)" if os.path.isfile(str(path)) else ""
        return DiskFull(f"{where}: disk full{free}; free some space there, or give another path, and run again")
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return UserError(f"{where}: cannot write it ({e.strerror}); give a path in a folder you can write")
    return UserError(f"{where}: cannot write it ({e.strerror or e}); give another path")
