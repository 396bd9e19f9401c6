"""The campaign folder on disk: bench-data/<YYYY-MM-DD>-<campaign>/ with the campaign file as given, a
versioned manifest (harness.formats.manifest) rewritten atomically as runs finish (ManifestSaver), and one folder
per run.

    campaign.yaml        the campaign file, verbatim
    manifest.json        bmoe-manifest: engine, git commit, target, plan, every run's record and file hashes
    runs/<run_id>/       metrics.csv, state.jsonl (device samples ~1/s), engine.log, outcome.json; in a quality
                         campaign also replies.jsonl (harness.formats.replies)
    prompts.jsonl        a quality campaign's questions, as handed to every run
    results.csv, findings.md, plots/   written by `bmoe-bench report` (and grades.json in a quality campaign)

A run is written under runs/.<run_id>.<pid>.tmp/ and renamed into place when it ends, its outcome.json
inside, so a folder either holds a whole run or none; the manifest is then updated (tmp name + rename) with
the run's outcome and the sha256 of each of its files. A new folder is built as .<name>.<pid>.tmp beside
it and renamed once its campaign.yaml and manifest are written: a folder without a manifest is never a
campaign's.

One runner per folder: `FolderLock` (an flock on <folder>/.lock, released by the kernel when its holder
dies, so a kill -9 never leaves it stuck; the file names the holder's PID; never opened through a symbolic
link, nor written when it is a hard link, a special file or another user's), and `campaign_lock` around
choosing or creating the folder (<root>/.<campaign>.lock), so two runners started together cannot both pick
the same folder. Holding the lock makes every temporary file there stale: cleared on resume. A retried run's
earlier attempts stay in its folder, under attempt-<n>/ (`commit_run`). A folder found under root is read
through load_manifest, which refuses one holding a link out of it (harness.formats.folder_guard); a link named
as a folder of the campaign is refused too."""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path

from harness.errors import ResourceError, UserError
from harness.formats.files import disk_full, is_disk_full
from harness.formats.folder import ATTEMPT_DIR, MANIFEST, OUTCOME_FILE, RUNS
from harness.formats.manifest import Manifest, hash_files, load_manifest, run_dir, save_manifest
from harness.formats.outcome import Outcome, read_outcome, write_outcome


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1000):03d}Z"


class FolderBusy(ResourceError):
    """Another live runner holds the folder (or the campaign's start)."""

    exit_code = 75  # EX_TEMPFAIL: try again when it has finished


class FolderLock:
    """An exclusive, non-blocking flock on `path` (created if needed), held until release(). The file
    holds `pid=<n> argv=<command>` of the holder. Raises FolderBusy naming the holder when taken."""

    def __init__(self, path: Path, what: str):
        self.path = Path(path)
        while True:
            fd = _open_lock(self.path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                t0 = time.monotonic()  # the holder writes its PID just after taking the lock: give it 2 s
                while not holder.startswith("PID ") and time.monotonic() - t0 < 2.0:
                    time.sleep(0.02)
                    holder = _holder(fd)
                os.close(fd)
                pid = re.match(r"PID (\d+)", holder)
                raise FolderBusy(f"{what} is in use by another bmoe-bench run ({holder}); wait for it to "
                                 f"finish, or stop it ({f'kill {pid.group(1)}' if pid else 'kill it'})"
                                 f" and run this command again") from None
            try:
                same = os.fstat(fd).st_ino == os.lstat(self.path).st_ino
            except FileNotFoundError:  # its holder removed it between our open and our lock: take a new one
                same = False
            if same:
                break
            os.close(fd)
        self.fd: int | None = fd
        text = f"pid={os.getpid()} argv={' '.join(_argv())}\n".encode()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, text, 0)
        except OSError as e:  # a full disk: the lock holds all the same, the PID is just not recorded
            if not is_disk_full(e):
                raise

    def release(self) -> None:
        if self.fd is not None:
            try:
                self.path.unlink(missing_ok=True)
            except OSError:
                pass
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _open_lock(path: Path) -> int:
    """The lock file, created if needed, never through a symbolic link (one would truncate its target), and only
    when it is a plain file of one name owned by this user: a hard link to another file (two names), a FIFO or
    a device is refused before a byte is written."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UserError(f"{path}: a symbolic link where bmoe-bench keeps its lock file; refused (remove "
                            f"the link and run the command again)") from None
        if is_disk_full(e):
            raise disk_full(path, None) from None
        raise UserError(f"{path}: cannot create the lock file there ({e.strerror}); name a folder you can "
                        f"write to") from None
    st = os.fstat(fd)
    why = ("not a plain file" if not stat.S_ISREG(st.st_mode) else
           f"a hard link: {st.st_nlink} names share this file" if st.st_nlink > 1 else
           f"owned by user {st.st_uid}, not by you" if st.st_uid != os.geteuid() else None)
    if why is not None:
        os.close(fd)
        raise UserError(f"{path}: {why}, where bmoe-bench keeps its lock file; refused (remove {path.name} and "
                        f"run the command again)")
    return fd


def _argv() -> list[str]:
    try:
        return [a for a in open("/proc/self/cmdline", "rb").read().decode(errors="replace").split("\0") if a]
    except OSError:
        return []


def _holder(fd: int) -> str:
    """'PID <n> (<command>)' from a lock file, or what is known."""
    try:
        text = os.pread(fd, 4096, 0).decode(errors="replace")
    except OSError:
        text = ""
    m = re.match(r"pid=(\d+) argv=(.*)", text.strip())
    if not m:
        return "its PID is not recorded yet"
    return f"PID {m.group(1)}" + (f": {m.group(2)}" if m.group(2) else "")


LOCK_FILE = ".lock"


def lock_folder(folder: Path) -> FolderLock:
    return FolderLock(Path(folder) / LOCK_FILE, f"{folder}")


def campaign_lock(root: Path, name: str) -> FolderLock:
    """Held while a runner picks or creates the folder of campaign `name` under root."""
    if Path(root).exists() and not Path(root).is_dir():
        raise UserError(f"{root}: a file, not a folder; campaign folders go under a folder (--out DIR)")
    try:
        Path(root).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        if is_disk_full(e):
            raise disk_full(root, None) from None
        raise UserError(f"{root}: cannot create this folder ({e.strerror}); campaign folders go under a "
                        f"folder you can write to (--out DIR)") from None
    return FolderLock(Path(root) / f".{name}.lock", f"campaign {name} under {root}")


def folder_name_re(name: str) -> re.Pattern[str]:
    return re.compile(rf"^\d{{4}}-\d{{2}}-\d{{2}}-{re.escape(name)}(-\d+)?$")


def new_folder(root: Path, name: str, t: float, fill: Callable[[Path], None] | None = None) -> Path:
    """A new dated folder of this campaign (with runs/), filled by `fill` under a temporary name first and
    then renamed into place: a half-made folder never carries a campaign's name. Call it under
    campaign_lock when other runners may start the same campaign."""
    day = time.strftime("%Y-%m-%d", time.gmtime(t))
    base = Path(root) / f"{day}-{name}"
    base.parent.mkdir(parents=True, exist_ok=True)
    tmp = base.with_name(f".{base.name}.{os.getpid()}.tmp")
    if tmp.is_symlink():  # planted under our name: filling it would write wherever it points
        tmp.unlink()
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        (tmp / RUNS).mkdir(parents=True)
        if fill is not None:
            fill(tmp)
        p, n = base, 2
        while p.exists():
            p = base.with_name(f"{base.name}-{n}")
            n += 1
        os.rename(tmp, p)
        return p
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if is_disk_full(e):
            raise disk_full(base, None, "free some space and run the command again") from None
        raise


def clear_stale_starts(root: Path, name: str) -> list[str]:
    """Half-made new folders of this campaign left by a runner that died while starting (call under
    campaign_lock: no live runner is making one then)."""
    gone = []
    pat = re.compile(rf"^\.\d{{4}}-\d{{2}}-\d{{2}}-{re.escape(name)}\.\d+\.tmp$")
    if Path(root).is_dir():
        for d in Path(root).iterdir():
            if pat.match(d.name) and d.is_symlink():
                d.unlink()  # the link only, never what it points at
                gone.append(d.name)
            elif pat.match(d.name) and d.is_dir():
                shutil.rmtree(d, ignore_errors=True)
                gone.append(d.name)
    return gone


def _folders(root: Path, name: str) -> list[tuple[Path, Manifest]]:
    """Every folder of this campaign under root, oldest name first. A folder named as this campaign's
    whose manifest cannot be read is an error naming it (never skipped: it may be an unfinished run of
    this very campaign)."""
    root = Path(root)
    if not root.is_dir():
        return []
    named = folder_name_re(name)
    out = []
    for d in sorted(root.iterdir()):
        if d.is_symlink() and named.match(d.name):  # resuming it would write wherever it points
            raise UserError(f"{d}: a symbolic link named as a folder of campaign {name}; refused (move it out "
                            f"of {root}, or start a new folder with --fresh)")
        if not d.is_dir() or not (d / MANIFEST).is_file() or f"-{name}" not in d.name:
            continue
        try:
            m = load_manifest(d)
        except UserError as e:
            if not named.match(d.name):
                continue
            raise UserError(f"{e}; {d} may be an unfinished folder of campaign {name}: restore its "
                            f"{MANIFEST} (git checkout -- {d}), or move the folder out of {root}, or start a "
                            f"new folder with --fresh") from None
        if m.campaign.name == name:
            out.append((d, m))
    return out


def find_resumable(root: Path, name: str, plan_hash: str, *, with_failed: bool = False,
                   shard: str | None = None) -> Path | None:
    """The newest unfinished folder of this campaign with the same plan and shard ("k/n", None: the whole
    plan), if any (with_failed: also a complete one that has failed runs)."""
    found = [d for d, m in _folders(root, name) if m.plan_hash == plan_hash and m.shard == shard and (
        m.status != "complete" or with_failed and any(r.status == "failed" for r in m.runs))]
    return found[-1] if found else None


def unfinished_elsewhere(root: Path, name: str, plan_hash: str) -> list[tuple[Path, list[str]]]:
    """Unfinished folders of this campaign with another plan (say, other --set overrides): each with its
    overrides, so the user can be told how to resume it."""
    return [(d, m.campaign.overrides) for d, m in _folders(root, name)
            if m.plan_hash != plan_hash and m.status != "complete"]


def tmp_run_dir(folder: Path, run_id: str) -> Path:
    """This process's half-written run folder."""
    return Path(folder) / RUNS / f".{run_id}.{os.getpid()}.tmp"


def clear_tmp(folder: Path) -> list[str]:
    """Remove half-written run folders and temporary files left by an interrupted campaign (call while
    holding the folder's lock: none of them is then live)."""
    gone = []
    for d in sorted([*(Path(folder) / RUNS).glob(".*.tmp"), *Path(folder).glob(".*.tmp")]):
        if d.is_dir():
            shutil.rmtree(d, ignore_errors=True)
        else:
            d.unlink(missing_ok=True)
        gone.append(d.name)
    return gone


def commit_run(folder: Path, run_id: str, outcome: Outcome, attempt: int = 1) -> dict[str, str]:
    """Write outcome.json into the tmp run folder, hash every file there, and rename it into place.
    `attempt` is this run's attempt number: a retried run keeps its earlier attempts' files under
    attempt-<n>/ (the failed run folder left in place is attempt n - 1). Returns the hashes (path relative
    to the run folder -> sha256) for the manifest."""
    tmp = tmp_run_dir(folder, run_id)
    write_outcome(tmp / OUTCOME_FILE, outcome)
    final = run_dir(folder, run_id)
    if final.is_symlink():
        raise UserError(f"{final}: a symbolic link where run {run_id} goes; refused (remove it)")
    if final.is_dir() and attempt > 1:
        keep = tmp / ATTEMPT_DIR.format(n=attempt - 1)
        os.rename(final, keep)
        for n in range(1, attempt - 1):  # the attempts before it, kept inside it by its own commit
            if (keep / ATTEMPT_DIR.format(n=n)).is_dir():
                os.rename(keep / ATTEMPT_DIR.format(n=n), tmp / ATTEMPT_DIR.format(n=n))
    elif final.exists():
        shutil.rmtree(final)
    hashes = hash_files(tmp)
    os.replace(tmp, final)
    return hashes


def reset_failed(m: Manifest) -> list[str]:
    """Mark failed runs pending again, keeping each old record under `previous_attempts`."""
    again = []
    for i, r in enumerate(m.runs):
        if r.status == "failed":
            m.runs[i] = r.retry()
            again.append(r.run_id)
    return again


def adopt_orphans(folder: Path, m: Manifest) -> list[str]:
    """Runs whose folder was committed but the manifest not updated (killed in between): take their
    outcome.json and file hashes into the manifest, so they are not run again."""
    adopted = []
    for i, r in enumerate(m.runs):
        if r.finished:
            continue
        d = run_dir(folder, r.run_id)
        if (d / OUTCOME_FILE).is_file():
            o = read_outcome(d / OUTCOME_FILE)
            if r.previous_attempts and o.start == r.previous_attempts[-1].start:
                continue  # the failed attempt a retry has not replaced yet: not this attempt's outcome
            m.runs[i] = r.finish(o, hash_files(d))
            adopted.append(r.run_id)
    return adopted


class ManifestSaver:
    """Rewrites a folder's manifest as its runs finish, at most a set share of the time: after a write that took
    w seconds, the next waits until w / SHARE seconds have passed. A manifest of thousands of runs takes a while
    to write, and written after every run it would make the harness's time per run grow with the number of runs
    (measured: bench-data/2026-12-03-scheduler/); a small one is still written after every run of any real
    length. Holding a write back loses nothing: each finished run is committed in its own folder (outcome.json
    and its files), which a resumed campaign adopts (adopt_orphans); `flush` writes what was held back."""

    SHARE = 0.05

    def __init__(self, folder: Path, clock: Callable[[], float] = time.monotonic):
        self.folder = Path(folder)
        self.clock = clock
        self.due = 0.0  # the next write goes ahead from then on
        self.held = False
        self.writes = 0

    def save(self, m: Manifest, *, now: bool = False) -> bool:
        """Write it, unless the last write was too recent (then it is held back); whether it was written."""
        if not now and self.clock() < self.due:
            self.held = True
            return False
        t0 = self.clock()
        save_manifest(self.folder, m)
        t1 = self.clock()
        self.due = t1 + (t1 - t0) / self.SHARE
        self.held = False
        self.writes += 1
        return True

    def flush(self, m: Manifest) -> None:
        if self.held:
            self.save(m, now=True)
