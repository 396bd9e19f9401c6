"""One engine command run under a fresh cgroup memory cap, watched: the cgroup's charge sampled while it runs (and,
when asked, the engine's own mappings), its metrics CSV read at the end (harness.memcap.search.RunFacts).

The command is given whole (either engine: `bmoe ...`, the C++ `bmoe-cli ...`); `--csv FILE` is appended to it (both
engines write the bmoe_metrics CSV). The model file is dropped from the page cache before each run
(posix_fadvise DONTNEED, as campaigns with `evict_model: true` do), so its reads are charged to this run's cap rather
than found in the cache for free. The page cache is not dropped otherwise: the interpreter's and the libraries'
code stay cached and charged to whoever read them first, as in the campaigns.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.campaigns.pagecache import evict_model_files
from harness.errors import UserError
from harness.formats.folder import METRICS_FILE
from harness.memcap.search import RunFacts
from harness.memcap.smaps import breakdown, cgroup_charge, parse_kv_kb, parse_memory_stat, parse_smaps
from harness.targets.cgroup import CappedCgroup, locate_self

MIB = 1 << 20
_MEMORY_LINES = ("bmoe:", "llama_kv_cache", "llama_context", "graph_reserve", "load_tensors", "KV buffer",
                 "compute buffer", "output buffer")


@dataclass
class Watched:
    """A capped run's facts and its memory as sampled."""

    facts: RunFacts
    wall_s: float
    peak_mib: float | None  # the cgroup's own peak
    charge: dict = field(default_factory=dict)  # bytes, at the sample of highest usage
    kinds: dict = field(default_factory=dict)  # harness.memcap.smaps.breakdown at the sample of highest anon
    rollup: dict = field(default_factory=dict)  # smaps_rollup at that sample, bytes
    lines: list[str] = field(default_factory=list)  # the engine's stderr lines about memory


def option_value(argv: list[str], *names: str) -> str | None:
    """The value after the first of `names` in argv (`-n 12`, `--n-predict=12`)."""
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
    return None


def tokens_asked(argv: list[str]) -> int:
    v = option_value(argv, "-n", "--n-predict")
    if v is None or not v.isdigit() or int(v) < 1:
        raise UserError("mincap: give the engine command a token count (-n N, N >= 1): the criterion checks that "
                        "every token was made")
    return int(v)


def decode_tok_s(csv_path: Path, warmup: int) -> tuple[int, float | None]:
    """(token rows, decode tok/s over the rows after the first `warmup`) of a metrics CSV; (0, None) when absent."""
    from harness.formats.metrics_csv import read_metrics

    if not csv_path.is_file():
        return 0, None
    try:
        m = read_metrics(csv_path)
    except UserError:
        return 0, None
    walls = m.wall_ms(warmup)
    n = len(m.rows)
    if not len(walls) or not (walls == walls).all() or walls.sum() <= 0:
        return n, None
    return n, len(walls) / (walls.sum() / 1e3)


class _Sampler(threading.Thread):
    """Reads the cgroup's charge every `interval` s, and with `maps` the process's smaps_rollup (and its full smaps
    whenever its anonymous memory reached a new high by 1 MiB or more)."""

    def __init__(self, cg: CappedCgroup, pid: int, interval: float, maps: bool):
        super().__init__(daemon=True)
        self.cg, self.pid, self.interval, self.maps = cg, pid, interval, maps
        self.stop = threading.Event()
        self.best_held = -1
        self.charge: dict = {}
        self.best_anon = -1
        self.kinds: dict = {}
        self.rollup: dict = {}

    def _read(self, name: str) -> str:
        try:
            return (self.cg.dir / name).read_text()
        except OSError:
            return ""

    def sample(self) -> None:
        v1 = self.cg.base.version == 1
        usage = self._read("memory.usage_in_bytes" if v1 else "memory.current").strip()
        kmem = self._read("memory.kmem.usage_in_bytes").strip() if v1 else ""
        charge = cgroup_charge(self.cg.base.version, parse_memory_stat(self._read("memory.stat")),
                               int(usage) if usage.isdigit() else None, int(kmem) if kmem.isdigit() else None)
        # the sample where the most memory could not be reclaimed (anonymous + kernel): at a tight cap the usage sits
        # at the cap from the load on (page cache), which says nothing about what the run needs
        held = (charge["anon"] or 0) + (charge["kernel"] or 0)
        if held >= self.best_held:
            self.best_held, self.charge = held, charge
        if not self.maps:
            return
        try:
            roll = parse_kv_kb(Path(f"/proc/{self.pid}/smaps_rollup").read_text())
            if roll.get("Anonymous", -1) >= self.best_anon + MIB:
                text = Path(f"/proc/{self.pid}/smaps").read_text()
                self.best_anon, self.rollup, self.kinds = roll["Anonymous"], roll, breakdown(parse_smaps(text))
        except (OSError, KeyError):  # gone, or not yet the engine
            pass

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            self.sample()


def run_capped(argv: list[str], cap_mib: int, *, timeout_s: float, warmup: int, evict: list[Path],
               maps: bool = False, interval_s: float = 0.1) -> Watched:
    """Run argv + --csv under a new cgroup capped at cap_mib (removed afterwards) and watch it."""
    tokens_asked(argv)
    for p in evict:
        evict_model_files(p)
    with tempfile.TemporaryDirectory(prefix=f"bmoe-mincap-{os.getpid()}-") as tmp, \
            CappedCgroup(locate_self(), cap_mib) as cg:
        csv_path, err_path = Path(tmp) / METRICS_FILE, Path(tmp) / "stderr.txt"
        with open(err_path, "wb") as err:
            t0 = time.monotonic()
            try:
                proc = subprocess.Popen(cg.wrap_argv([*argv, "--csv", str(csv_path)]), stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
            except OSError as e:
                raise UserError(f"mincap: cannot start {argv[0]}: {e.strerror}") from None
            sampler = _Sampler(cg, proc.pid, interval_s, maps)
            sampler.start()
            timed_out = False
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            except BaseException:
                _kill(proc, cg)
                raise
            finally:
                sampler.stop.set()
                sampler.join()
            if timed_out:
                _kill(proc, cg)
            wall = time.monotonic() - t0
        n, tok_s = decode_tok_s(csv_path, warmup)
        rc = proc.returncode
        facts = RunFacts(exit_code=None if timed_out or rc is None or rc < 0 else rc, oom_kills=cg.oom_kills(),
                         timed_out=timed_out, tokens=n, tok_s=tok_s)
        peak = cg.peak_bytes()
        lines = [s.strip() for s in err_path.read_text(errors="replace").splitlines()
                 if any(k in s for k in _MEMORY_LINES)]
        return Watched(facts, wall, round(peak / MIB, 1) if peak is not None else None, sampler.charge,
                       sampler.kinds, sampler.rollup, lines[-40:])


def _kill(proc: subprocess.Popen, cg: CappedCgroup) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    cg.kill_all()
    proc.wait()
