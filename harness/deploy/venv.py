"""`bmoe-bench deploy`: bmoe at the harness's own version in a venv on an SSH target (DIR/venv), with its
pinned llama-cpp-python built without llamafile, and the stamp DIR/deploy.json (harness.deploy.stamp).

Idempotent: when the target's stamp matches the wanted one key by key and the venv's `bmoe --version`
answers, nothing is copied, built or installed. Otherwise only what differs is redone: a new Python or
--system-site-packages makes a new venv; llama-cpp-python is built (or installed) only when the venv lacks
the pinned version without llamafile; bmoe itself is reinstalled from the source archive.

Where llama-cpp-python and the other dependencies come from:
- the harness's own environment (harness.deploy.wheels), when the target can run its binaries (same machine type,
  Python ABI, libc no older, CPU features no fewer; `--from auto`, or `--from harness` to insist): packed as
  wheels, copied (by hash) and installed with no index: no network needed there, no build;
- otherwise (`--from target`, or an incompatible target: a phone, an ARM board): the target's package index;
  llama-cpp-python is built there from its sdist with CMAKE_ARGS as scripts/setup.sh sets them (the wheel is
  kept in DIR/wheels/built-<flags hash>, so a later deploy of a new bmoe does not build it again).
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from harness.deploy import build_tools
from harness.deploy.stamp import (
    CMAKE_ARGS,
    LLAMA_CPP_PYTHON,
    STAMP_FILE,
    differences,
    harness_version,
    parse_stamp,
    source_archive,
    wanted_stamp,
)
from harness.devices.parse import last_line
from harness.devices.sh import sh_join
from harness.devices.ssh import SshLink
from harness.errors import UserError

BUILD_TIMEOUT_S = 4 * 3600.0  # llama.cpp on a phone's cores
_LLAMA_CHECK = ("import llama_cpp; print(llama_cpp.__version__); "
                "print('LLAMAFILE = 1' in llama_cpp.llama_print_system_info().decode())")


def _host_info() -> tuple[dict, set[str]]:
    import sysconfig

    from harness.deploy.wheels import cpu_flags

    info = {"version": platform.python_version(), "soabi": sysconfig.get_config_var("SOABI"),
            "machine": platform.machine(), "libc": list(platform.libc_ver())}
    try:
        flags = cpu_flags(Path("/proc/cpuinfo").read_text(errors="replace"))
    except OSError:
        flags = set()
    return info, flags


class Deployer:
    """One deploy to the target behind `link`, in `target_dir`, with the target's `python`."""

    def __init__(self, link: SshLink, target_dir: str, *, python: str = "python3", source: str = "auto",
                 system_site_packages: bool = False, say: Callable[[str], None] = print):
        self.link, self.dir, self.python, self.source = link, target_dir, python, source
        self.ssp, self.say = system_site_packages, say
        self.venv_py = f"{target_dir}/venv/bin/python"

    def sh(self, words: list[str], what: str, timeout: float = 600.0, env: dict | None = None) -> str:
        """Run a command there that must succeed; UserError naming `what` and its last output line."""
        pre = ["env", *(f"{k}={v}" for k, v in env.items())] if env else []
        code, out, err = self.link.shell(sh_join(pre + words), timeout=timeout)
        if code != 0:
            name = re.sub(r"[^A-Za-z0-9.@-]", "_", f"{self.link.serial}.log")
            log = Path.home() / ".cache" / "bmoe" / "deploy" / name
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(f"$ {sh_join(pre + words)}\n{out}\n{err}")
            lines = [ln.strip() for ln in (err + "\n" + out).splitlines() if ln.strip()]
            why = next((ln for ln in reversed(lines) if ln.startswith("ERROR:")), None) \
                or next((ln for ln in reversed(lines) if not ln.startswith("hint:")), f"exit {code}")
            raise UserError(f"deploy to {self.link.serial}: {what} failed: {why[:300]} (its output: {log})")
        return out

    def probe(self) -> dict:
        from harness.deploy.wheels import PROBE

        code, out, err = self.link.shell(sh_join([self.python, "-c", PROBE]))
        if code != 0:
            raise UserError(f"deploy to {self.link.serial}: no {self.python} there ({last_line(err) or f'exit {code}'})"
                            "; install Python 3.11+ (Termux: pkg install python) or give --python PATH")
        info = json.loads(out)
        if tuple(int(x) for x in info["version"].split(".")[:2]) < (3, 11):
            raise UserError(f"deploy to {self.link.serial}: {self.python} there is Python {info['version']}; bmoe "
                            "needs 3.11 or newer: give --python PATH")
        return info

    def run(self) -> bool:
        """Deploy; False when the target was up to date (nothing done)."""
        info = self.probe()
        want = wanted_stamp(info["version"], self.ssp)
        code, out, _ = self.link.shell(sh_join(["cat", f"{self.dir}/{STAMP_FILE}"]))
        have = parse_stamp(out if code == 0 else None)
        diffs = differences(have, want)
        if not diffs and self._answers():
            self.say(f"deploy: {self.link.serial} is up to date (bmoe {want['bmoe']}, llama-cpp-python "
                     f"{LLAMA_CPP_PYTHON} without llamafile, Python {want['python']} in {self.dir}/venv): "
                     "nothing to do")
            return False
        self.say(f"deploy: {self.link.serial}: {'; '.join(diffs) or 'the venv does not answer'}")
        if have is None or have.get("python") != want["python"] or have.get("system_site_packages") != self.ssp \
                or not self._answers(python_only=True):
            self.say(f"deploy: new venv {self.dir}/venv ({self.python}, Python {info['version']})")
            self.sh(["rm", "-rf", f"{self.dir}/venv", f"{self.dir}/{STAMP_FILE}"], "removing the old venv")
            self.sh([self.python, "-m", "venv", *(["--system-site-packages"] if self.ssp else []), f"{self.dir}/venv"],
                    "creating the venv", timeout=600)
        else:  # the stamp goes while the venv changes: a deploy cut short is never taken for a finished one
            self.sh(["rm", "-f", f"{self.dir}/{STAMP_FILE}"], "removing the stamp")
        why_not = self._incompatible(info)
        if self.source == "harness" and why_not:
            raise UserError(f"deploy to {self.link.serial}: --from harness, but the target cannot run the harness's "
                            f"binaries ({why_not}); use --from target")
        use_harness = self.source != "target" and why_not is None
        if self.source == "auto" and why_not:
            self.say(f"deploy: the harness's own builds do not fit ({why_not}): installing from the target's "
                     "package index, llama-cpp-python built there")
        with tempfile.TemporaryDirectory(prefix="bmoe-deploy-") as tmp:
            archive = source_archive(Path(tmp))
            llama_from = self._from_harness(archive) if use_harness else self._from_target(archive)
        version, llamafile = self._check_llama()
        bmoe = self.sh([f"{self.dir}/venv/bin/bmoe", "--version"], "running the deployed bmoe").strip()
        if version != LLAMA_CPP_PYTHON or llamafile:
            raise UserError(f"deploy to {self.link.serial}: the venv's llama-cpp-python is {version}"
                            f"{' with llamafile' if llamafile else ''}, not {LLAMA_CPP_PYTHON} without it")
        stamp = {**want, "llama_from": llama_from, "bmoe_version_line": bmoe, "deployed": time.strftime(
            "%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "from_host": socket.gethostname()}
        part = f"{self.dir}/{STAMP_FILE}.part"
        with tempfile.TemporaryFile() as f:
            f.write((json.dumps(stamp, indent=1, sort_keys=True) + "\n").encode())
            f.seek(0)
            code, _, err = self.link.shell(f"cat > {sh_join([part])} && mv -f {sh_join([part])} "
                                           f"{sh_join([f'{self.dir}/{STAMP_FILE}'])}", stdin=f)
        if code != 0:
            raise UserError(f"deploy to {self.link.serial}: writing {STAMP_FILE} failed: {last_line(err)}")
        self.say(f"deploy: {self.link.serial} now has {bmoe} (harness {harness_version()}), llama-cpp-python "
                 f"{version} without llamafile ({llama_from})")
        return True

    def _answers(self, python_only: bool = False) -> bool:
        exe = self.venv_py if python_only else f"{self.dir}/venv/bin/bmoe"
        code, _, _ = self.link.shell(sh_join([exe, "--version"]), timeout=120)
        return code == 0

    def _incompatible(self, info: dict) -> str | None:
        from harness.deploy.wheels import cpu_flags, incompatibility

        host, host_flags = _host_info()
        _, cpuinfo, _ = self.link.shell(sh_join(["cat", "/proc/cpuinfo"]))
        return incompatibility(host, info, host_flags, cpu_flags(cpuinfo))

    def _check_llama(self) -> tuple[str | None, bool]:
        code, out, _ = self.link.shell(sh_join([self.venv_py, "-c", _LLAMA_CHECK]), timeout=120)
        lines = out.split()
        return (lines[0], lines[1] == "True") if code == 0 and len(lines) == 2 else (None, False)

    def _pip(self, *args: str, what: str, timeout: float = 1800.0, env: dict | None = None) -> str:
        return self.sh([self.venv_py, "-m", "pip", "--disable-pip-version-check", "-q", *args], what, timeout, env)

    def _push(self, local: Path, sub: str) -> str:
        self.sh(["mkdir", "-p", f"{self.dir}/{sub}"], f"creating {sub}")
        remote = f"{self.dir}/{sub}/{local.name}"
        self.link.push(local, remote, "deploy file")
        return remote

    def _install_bmoe(self, archive: Path, *index: str) -> None:
        src = self._push(archive, f"src/{harness_version().rpartition('.')[2]}")  # a folder per source hash
        self._pip("uninstall", "-y", "bmoe", what="removing the old bmoe")
        self._pip("install", "--no-compile", "--no-cache-dir", *index, "--no-build-isolation", src,
                  what="installing bmoe", timeout=3600)

    def _from_harness(self, archive: Path) -> str:
        import llama_cpp  # the harness's own build: it must be the one without llamafile

        from harness.deploy.wheels import pack, runtime_closure

        if "LLAMAFILE = 1" in llama_cpp.llama_print_system_info().decode():
            raise UserError("deploy: the harness's own llama-cpp-python was built with llamafile; run "
                            "scripts/setup.sh (it rebuilds it without), or deploy with --from target")

        dists = runtime_closure()
        need = build_tools.requires()
        bad = build_tools.unmet(need, {d.metadata["Name"].lower(): d.version for d in dists})
        if bad:
            raise UserError(f"deploy: the harness's build tools cannot build bmoe ({', '.join(bad)}: pyproject.toml "
                            "needs them); run scripts/setup.sh (it installs them)")
        t = time.monotonic()
        wheels = [pack(d) for d in dists]
        self.say(f"deploy: {len(wheels)} wheels from the harness's environment ({time.monotonic() - t:.1f} s to "
                 f"pack or find in the cache), copying those that differ")
        sub = "wheels/harness-env"
        self.sh(["mkdir", "-p", f"{self.dir}/{sub}"], "creating the wheel folder")
        for w in wheels:
            self.link.push(w, f"{self.dir}/{sub}/{w.name}", "wheel")
        index = ("--no-index", "--find-links", f"{self.dir}/{sub}")
        names = {build_tools.parse(r)[0] for r in need}  # the build tools, pinned: the venv's own
        tools = [f"{d.metadata['Name']}=={d.version}" for d in dists  # setuptools is too old for pyproject
                 if d.metadata["Name"].lower() in names]
        self._pip("install", "--no-compile", *index, *tools, what="installing the build tools")
        self._install_bmoe(archive, *index)
        return "the harness's own build, copied (same machine type, ABI, libc and CPU features)"

    def _from_target(self, archive: Path) -> str:
        self._pip("install", "--upgrade", "pip", *build_tools.requires(), what="installing the build tools")
        version, llamafile = self._check_llama()
        if version == LLAMA_CPP_PYTHON and not llamafile:
            how = "built on the target earlier (kept)"
        else:
            built = f"{self.dir}/wheels/built-{hashlib.sha256(CMAKE_ARGS.encode()).hexdigest()[:8]}"  # per build flags
            code, out, _ = self.link.shell(sh_join(["sh", "-c", 'ls "$1"/llama_cpp_python-*.whl', "ls", built]))
            have = out.split()
            if code != 0 or not have:
                self.say(f"deploy: building llama-cpp-python {LLAMA_CPP_PYTHON} on the target without llamafile "
                         "(10 minutes on 2 x86 cores; longer on a phone)")
                self._pip("wheel", "--no-deps", "--no-binary", "llama-cpp-python", "--no-cache-dir", "-w", built,
                          f"llama-cpp-python=={LLAMA_CPP_PYTHON}", what="building llama-cpp-python",
                          timeout=BUILD_TIMEOUT_S, env={"CMAKE_ARGS": CMAKE_ARGS})
                have = self.link.shell(sh_join(["sh", "-c", 'ls "$1"/llama_cpp_python-*.whl', "ls", built]))[1].split()
            self._pip("install", "--no-deps", "--force-reinstall", have[-1], what="installing llama-cpp-python")
            how = "built on the target"
        self._install_bmoe(archive)
        return how


def deploy(link: SshLink, target_dir: str, **kw) -> tuple[bool, float]:
    """(whether anything was done, seconds taken)."""
    t = time.monotonic()
    changed = Deployer(link, target_dir, **kw).run()
    return changed, time.monotonic() - t
