"""The SSH and Termux targets of campaign files, as `bmoe-bench devices --campaign FILE` lists them: whether they
answer, and which bmoe is deployed there (the harness's version or not)."""

from __future__ import annotations

from harness.deploy.stamp import STAMP_FILE, harness_version, parse_stamp
from harness.devices.sh import sh_join
from harness.errors import BmoeError, UserError


def target_lines(paths: list[str], details: bool = False) -> list[str]:
    """One tab-separated line per ssh or termux target of the campaign files."""
    from harness.campaigns.schema import load_campaign
    from harness.targets.ssh import ssh_target

    lines = []
    for path in paths:
        t = load_campaign(path).target
        if t.kind not in ("ssh", "termux"):
            continue
        name = (f"ssh {t.user + '@' if t.user else ''}{t.host}:{t.port or 22}" if t.kind == "ssh"
                else f"termux {t.serial or '(the only adb device)'}")
        try:
            target = ssh_target(t)
        except BmoeError as e:
            lines.append(f"{name}\tunreachable\t{e}\t({path})")
            continue
        try:
            code, out, _ = target.link.shell(sh_join(["cat", f"{target.dir}/{STAMP_FILE}"]))
            stamp = parse_stamp(out if code == 0 else None)
            if stamp is None:
                dep = f"bmoe not deployed (bmoe-bench deploy {path})"
            elif stamp.get("bmoe") == harness_version():
                dep = f"bmoe {stamp.get('bmoe')} (the harness's)"
            else:
                dep = f"bmoe {stamp.get('bmoe')}, the harness is {harness_version()} (bmoe-bench deploy {path})"
            cols = [name, "ready", dep]
            if details:
                d = target.describe()
                cols += [d.get("model") or d.get("hardware") or "", d.get("kernel") or "",
                         f"{d.get('dir_free_mib')} MiB free in {target.dir}"]
            lines.append("\t".join([*cols, f"({path})"]))
        except UserError as e:
            lines.append(f"{name}\terror\t{e}\t({path})")
        finally:
            target.close()
    return lines
