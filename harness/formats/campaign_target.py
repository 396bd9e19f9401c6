"""A campaign's `target:` (harness.formats.campaign): where the engine runs. Its own module so that the campaign
file's module stays under 400 lines."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from harness.formats.campaign_ssh import SSH_KEYS


class _Model(BaseModel):  # as the campaign file's parts: strict, frozen, no unknown keys
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class TargetSpec(_Model):
    kind: Literal["local", "adb", "ssh", "termux"] = Field("local", description=(
        "where the engine runs: this machine, a device over adb, a machine over SSH, or a phone's Termux (SSH "
        "through an adb forward)"))
    serial: str | None = Field(None, description="adb or termux: the device's serial (needed when more than one "
                                                 "is attached)")
    mem_cap_mib: int | None = Field(None, ge=16, description="local: a cgroup memory cap per run (page cache "
                                                             "is charged to it)")
    drop_caches: bool = Field(False, description="local, root: drop the page cache before each run")
    evict_model: bool = Field(True, description="local: evict the model file from the page cache before each run")
    host: str | None = Field(None, description="ssh: host name or address (or a Host of ~/.ssh/config)")
    port: int | None = Field(None, ge=1, le=65535, description="ssh: port (default 22); termux: Termux's sshd port "
                                                              "on the phone (default 8022)")
    user: str | None = Field(None, description="ssh, termux: user name there (default: ssh's)")
    identity_file: str | None = Field(None, description="ssh, termux: private key (default: ssh's keys and agent)")
    known_hosts: str | None = Field(None, description="ssh, termux: a known_hosts file of its own (default: ssh's; "
                                                      "a new host key is trusted on first use, then checked)")
    dir: str | None = Field(None, description="ssh, termux: the folder there for the deployed venv, staged files "
                                              "and runs (default ~/bmoe)")

    @model_serializer(mode="wrap")
    def _ssh_keys_when_set(self, handler):  # unset, they are left out: other targets' plans hash as before
        return {k: v for k, v in handler(self).items() if k not in SSH_KEYS or v is not None}
