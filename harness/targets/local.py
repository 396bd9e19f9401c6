"""This machine as a target: the engine as a subprocess in its own process group, optionally inside a
cgroup child with a memory cap (harness.targets.cgroup), with the page cache dropped before each run
if asked (root only)."""

from __future__ import annotations

import os
import platform
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

from harness import interrupts
from harness.devices import state as devstate
from harness.errors import UserError
from harness.formats.files import copy_file, disk_full, free_bytes, is_disk_full
from harness.targets.base import LineCallback, RunOutcome, exit_reason
from harness.targets.cgroup import CappedCgroup, CgroupBase, locate_self, pid_alive

_KILL_GRACE_S = 2.0
RUN_DIR_PREFIX = "bmoe-run-"
TEMP_PREFIXES = (RUN_DIR_PREFIX, "bmoe-version-")  # temporary directories named <prefix><pid>-*



def sweep_stale_temp_dirs(tmp: str | None = None) -> list[str]:
    """Remove bmoe's temporary directories whose process is gone (named <prefix><pid>-*)."""
    base = Path(tmp or tempfile.gettempdir())
    gone = []
    for prefix in TEMP_PREFIXES:
        for d in base.glob(f"{prefix}*"):
            pid = d.name[len(prefix):].split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)) and d.is_dir():
                shutil.rmtree(d, ignore_errors=True)
                gone.append(str(d))
    return gone


def drop_page_cache() -> bool:
    """sync, then drop clean page cache, dentries and inodes. False when not root or not permitted."""
    if os.geteuid() != 0:
        return False
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        return False
    return True


class _Pumps:
    """Threads that copy the child's stdout and stderr into the log, stdout lines also to a callback. A
    log write that fails (a full disk) is kept in `log_error` and the pipes are still drained to the end:
    an engine never blocks on its output."""

    def __init__(self, proc: subprocess.Popen, log, on_stdout_line: LineCallback | None):
        self.lock = threading.Lock()
        self.log = log
        self.cb = on_stdout_line
        self.stderr_tail: deque[str] = deque(maxlen=20)
        self.cb_error: BaseException | None = None
        self.log_error: OSError | None = None
        self.threads = [
            threading.Thread(target=self._pump, args=(proc.stdout, True), daemon=True),
            threading.Thread(target=self._pump, args=(proc.stderr, False), daemon=True),
        ]
        for t in self.threads:
            t.start()

    def _pump(self, stream, is_stdout: bool) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            with self.lock:
                if self.log_error is None:
                    try:
                        self.log.write(line if line.endswith("\n") else line + "\n")
                        self.log.flush()
                    except OSError as e:
                        self.log_error = e
            text = line.rstrip("\r\n")
            if is_stdout:
                if self.cb is not None and self.cb_error is None:
                    try:
                        self.cb(text)
                    except BaseException as e:  # reported after the run, not lost in a thread
                        self.cb_error = e
            else:
                self.stderr_tail.append(text)
        stream.close()

    def join(self, timeout: float) -> None:
        for t in self.threads:
            t.join(timeout)


def _die_with_parent_fn():
    """A preexec_fn that has the kernel SIGKILL the engine when this process dies (a runner killed with -9
    must not leave an engine running, competing with the next run for the cores); None off Linux."""
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def fn() -> None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before that: do not start at all
            os._exit(1)

    return fn


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _kill_group(proc: subprocess.Popen, cg: CappedCgroup | None) -> None:
    """SIGTERM to the engine's process group, SIGKILL after a short grace, and SIGKILL to anything
    left in its cgroup (a child that left the group)."""
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(_KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc.pid, signal.SIGKILL)
    if cg is not None:
        cg.kill_all()
    _reap(proc)


def _reap(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """Wait for a killed child. Popen.wait(timeout) takes its internal lock with acquire(False) before its
    try/finally: a Ctrl-C landing between the two leaves the lock held for good, and a later untimed wait()
    then blocks forever (seen in CI: a runner hung after SIGINT with its engine a zombie). A timed wait
    cannot hang on it; past the grace the child (SIGKILLed, so gone) is reaped with waitpid directly."""
    try:
        proc.wait(grace_s)
        return
    except subprocess.TimeoutExpired:
        pass
    try:
        _, status = os.waitpid(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    except ChildProcessError:  # reaped meanwhile
        pass


class LocalTarget:
    """Runs engines on this machine.

    mem_cap_mib: if set, each run gets a fresh cgroup child with this memory limit (page cache charged),
        removed after the run; an OOM kill inside it is reported as the run's reason and
        RunOutcome.peak_mem_mib holds the cgroup's peak.
    drop_caches: if True, run() drops the page cache before each engine start (needs root: checked here).
    """

    kind = "local"

    def __init__(self, mem_cap_mib: int | None = None, drop_caches: bool = False, *, env: dict | None = None):
        self.mem_cap_mib = mem_cap_mib
        self.drop_before_run = drop_caches
        self.env = env
        self._cg_base: CgroupBase | None = locate_self() if mem_cap_mib is not None else None
        if mem_cap_mib is not None and mem_cap_mib <= 0:
            raise UserError(f"mem_cap_mib: {mem_cap_mib} is not a positive size in MiB")
        if drop_caches and os.geteuid() != 0:
            raise UserError("drop_caches: dropping the page cache needs root; run as root or set it false")
        self._run_dir: str | None = None

    # ---- Target protocol -------------------------------------------------------------------------------

    def describe(self) -> dict:
        mem = devstate.parse_meminfo(_read("/proc/meminfo"))
        return {
            "kind": "local",
            "hostname": socket.gethostname(),
            "kernel": platform.release(),
            "machine": platform.machine(),
            "cpu_model": _cpu_model(),
            "cpus": os.cpu_count(),
            "mem_total_mib": mem["mem_total_mib"],
            "python": platform.python_version(),
            "mem_cap_mib": self.mem_cap_mib,
            "cgroup": (
                {"version": self._cg_base.version, "parent": str(self._cg_base.dir)}
                if self._cg_base
                else None
            ),
            "drop_caches": self.drop_before_run,
        }

    def stage(self, local: Path, kind: str) -> str:
        p = Path(local)
        if not p.is_file():
            raise UserError(f"{kind}: {p} does not exist or is not a file")
        return str(p.resolve())

    def run_dir(self) -> str:
        """A temporary directory named after this process (bmoe-run-<pid>-*), removed by close(); those of
        processes no longer alive (a runner killed with -9) are removed here, at the next run."""
        if self._run_dir is None:
            sweep_stale_temp_dirs()
            self._run_dir = tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{os.getpid()}-")
        return self._run_dir

    def sample_state(self) -> dict:
        return devstate.read_local(Path("/"))

    def drop_caches(self) -> bool:
        return drop_page_cache()

    def close(self) -> None:
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            self._run_dir = None

    def run(
        self,
        argv: list[str],
        *,
        timeout_s: float,
        outputs: list[str],
        out_dir: Path,
        log_path: Path,
        on_stdout_line: LineCallback | None = None,
    ) -> RunOutcome:
        if not argv:
            raise UserError("engine command is empty")
        if shutil.which(argv[0]) is None:
            raise UserError(f"engine: {argv[0]} is not an executable file or a command on PATH")
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.drop_before_run and not drop_page_cache():
            raise UserError("drop_caches: could not write /proc/sys/vm/drop_caches")

        cg = CappedCgroup(self._cg_base, self.mem_cap_mib) if self._cg_base is not None else None
        try:
            return self._run(argv, cg, timeout_s, outputs, out_dir, log_path, on_stdout_line)
        finally:
            if cg is not None:
                cg.remove()

    # ---- internals -------------------------------------------------------------------------------------

    def _run(self, argv, cg, timeout_s, outputs, out_dir, log_path, on_stdout_line) -> RunOutcome:
        full = cg.wrap_argv(argv) if cg is not None else list(argv)
        timed_out = False
        try:
            log = open(log_path, "w", encoding="utf-8")
        except OSError as e:
            if is_disk_full(e):
                raise disk_full(log_path, None) from None
            raise
        with log:
            t0 = time.monotonic()
            try:
                proc = subprocess.Popen(
                    full,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    env=self.env,
                    preexec_fn=_die_with_parent_fn(),
                )
            except ValueError as e:  # a NUL byte in an argument (validation refuses those in a campaign file)
                raise UserError(f"cannot start the engine: {e} in its command line; remove it from the "
                                "campaign") from None
            pumps = _Pumps(proc, log, on_stdout_line)
            try:
                deadline = t0 + timeout_s
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        timed_out = True
                        _kill_group(proc, cg)
                        break
                    try:
                        proc.wait(min(left, 0.25))
                        break
                    except subprocess.TimeoutExpired:
                        interrupts.check()
            except BaseException:  # KeyboardInterrupt (or anything else): leave nothing running
                _kill_group(proc, cg)
                pumps.join(2.0)
                raise
            wall = time.monotonic() - t0
            # the leader may have exited while children still hold the pipes
            _signal_group(proc.pid, signal.SIGKILL)
            pumps.join(5.0)
            if timed_out and pumps.log_error is None:
                try:
                    log.write(f"[bmoe-bench] killed after the {timeout_s:g} s timeout\n")
                except OSError as e:
                    pumps.log_error = e
            try:
                log.close()
            except OSError as e:  # the flush at close
                pumps.log_error = pumps.log_error or e

        if pumps.log_error is not None:
            e = pumps.log_error
            if is_disk_full(e):
                raise disk_full(log_path, None)
            raise UserError(f"{log_path}: cannot write the engine log ({e.strerror})")
        if pumps.cb_error is not None:
            raise pumps.cb_error
        rc = proc.returncode
        kills = cg.oom_kills() if cg is not None else 0
        oom = kills > 0
        peak = cg.peak_bytes() if cg is not None else None
        stderr_tail = "\n".join(pumps.stderr_tail)

        reason: str | None = None
        if timed_out:
            reason = f"timeout after {timeout_s:g} s"
        elif oom:
            assert cg is not None
            reason = oom_reason(self.mem_cap_mib, cg.oom_file, kills)
        elif rc != 0:
            reason = exit_reason(rc, stderr_tail)
            full = _full_disk([str(Path(o).parent) for o in outputs] + [str(out_dir)])
            if full is not None:  # the engine failed on a full disk: not the run's fault, resumable
                raise disk_full(full, None)

        fetched, missing = _collect(outputs, out_dir)
        if reason is None and missing:
            reason = f"engine exited 0 but did not write {missing[0]}"
        return RunOutcome(
            exit_code=None if (timed_out or rc is None or rc < 0) else rc,
            reason=reason,
            wall_s=wall,
            fetched=fetched,
            peak_mem_mib=round(peak / 2**20, 1) if peak is not None else None,
            oom_killed=oom,
        )


def oom_reason(cap_mib: int | None, oom_file: str, kills: int) -> str:
    """What a run ended by the kernel's OOM killer inside its cap is told (the harness runner and the capped CLI)."""
    return (f"killed by the kernel's OOM killer under the {cap_mib} MiB cap (cgroup {oom_file}: oom_kill {kills}); "
            "give it a larger cap or ask less of it (a smaller --cache-mb)")


def _collect(outputs: list[str], out_dir: Path) -> tuple[dict[str, Path], list[str]]:
    """Copy each output into out_dir (unless it is already there)."""
    fetched: dict[str, Path] = {}
    missing: list[str] = []
    for p in outputs:
        src = Path(p)
        if not src.is_file():
            missing.append(p)
            continue
        dest = out_dir / src.name
        if src.resolve() != dest.resolve():
            copy_file(src, dest)
        fetched[p] = dest
    return fetched, missing


_NEARLY_FULL = 256 * 1024


def _full_disk(dirs: list[str]) -> str | None:
    """The first of dirs on a filesystem with (almost) no space left, if any."""
    for d in dirs:
        free = free_bytes(d)
        if free is not None and free < _NEARLY_FULL:
            return d
    return None


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _cpu_model() -> str | None:
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or None
