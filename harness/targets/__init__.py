"""Where engines run: this machine (`LocalTarget`, optional cgroup memory cap) or an adb device
(`AdbTarget`). See base.py for the `Target` protocol the campaign runner uses."""

from harness.targets.base import RunOutcome, Target
from harness.targets.local import LocalTarget

__all__ = ["LocalTarget", "RunOutcome", "Target"]
