"""Where engines run: this machine (`LocalTarget`, optional cgroup memory cap), an adb device (`AdbTarget`) or a
machine over SSH (`SshTarget`, a phone's Termux included). See base.py for the `Target` protocol the campaign
runner uses."""

from harness.targets.base import RunOutcome, Target
from harness.targets.local import LocalTarget

__all__ = ["LocalTarget", "RunOutcome", "Target"]
