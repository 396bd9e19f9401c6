"""The target keys of ssh and termux campaigns (harness.formats.campaign's TargetSpec) and the rules between them."""

from __future__ import annotations

SSH_KEYS = ("host", "port", "user", "identity_file", "known_hosts", "dir")  # target keys of ssh and termux


def ssh_problems(t) -> list[tuple[tuple[str, ...], str]]:
    """(location, message) for every SSH rule a campaign's `target:` breaks."""
    given = [k for k in SSH_KEYS if getattr(t, k) is not None]
    if t.kind not in ("ssh", "termux"):
        return [(("target", k), f"target.{k} is for target ssh or termux") for k in given]
    if t.kind == "ssh" and t.host is None:
        return [(("target",), "target ssh needs host (and port, user, identity_file as ssh needs them)")]
    if t.kind == "ssh" and t.serial is not None:
        return [(("target", "serial"), "target.serial is for adb or termux; an ssh target is its host")]
    if t.kind == "termux" and t.host is not None:
        return [(("target", "host"), "target termux is reached at 127.0.0.1 through an adb forward: give its "
                                      "serial, not host")]
    return []
