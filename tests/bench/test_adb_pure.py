"""harness.devices.adb's pure parts (harness.devices.parse, harness.devices.sh), without a device: device choice,
quoting, df/sha256 parsing, the shell v2 frame decoder, the sha256 fallback script."""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import pytest

from harness.devices import adb_stream
from harness.devices import parse as adb_parse
from harness.devices import sh as adb_shell
from harness.errors import UserError


def test_choose_serial_by_argument_env_or_single():
    devs = [("emulator-5554", "device"), ("R5CT123", "unauthorized"), ("127.0.0.1:15555", "device")]
    assert adb_parse.choose_serial(devs, "127.0.0.1:15555", None) == "127.0.0.1:15555"
    assert adb_parse.choose_serial(devs, None, "emulator-5554") == "emulator-5554"
    assert adb_parse.choose_serial([("a", "device"), ("b", "offline")], None, None) == "a"


@pytest.mark.parametrize(
    "devs, serial, env, match",
    [
        ([("a", "device")], "zz", None, r"target serial zz: no such adb device \(adb devices lists: a \(device\)\)"),
        ([("a", "device"), ("b", "unauthorized")], "b", None, "b: adb device is unauthorized"),
        ([("a", "device")], None, "zz", "ANDROID_SERIAL zz: no such adb device"),
        ([], None, None, r"no adb device ready \(adb devices lists: none\)"),
        ([("a", "offline")], None, None, r"no adb device ready \(adb devices lists: a \(offline\)\)"),
        ([("a", "device"), ("b", "device")], None, None, r"several adb devices \(a \(device\), b \(device\)\)"),
    ],
)
def test_choose_serial_errors_list_the_devices(devs, serial, env, match):
    with pytest.raises(UserError, match=match):
        adb_parse.choose_serial(devs, serial, env)


NASTY = [
    "'; touch /tmp/pwned; '",
    "$(touch /tmp/pwned)",
    "`touch /tmp/pwned`",
    'a "quoted" word',
    "line\nbreak; rm -rf /nonexistent",
    "",
    "*",
    "~",
    "-n",
    "$HOME ${PATH} $$ \\ \t end",
]


def test_sh_join_keeps_every_word_literal_in_a_real_shell(tmp_path):
    marker = tmp_path / "pwned"
    words = [w.replace("/tmp/pwned", str(marker)) for w in NASTY]
    line = adb_shell.sh_join(["printf", "%s\\0", *words])
    out = subprocess.run(["sh", "-c", line], capture_output=True, check=True, timeout=10).stdout
    assert out.split(b"\0")[:-1] == [w.encode() for w in words]
    assert not marker.exists()


@pytest.mark.parametrize(
    "text, want",
    [
        (
            "Filesystem     1024-blocks    Used Available Capacity Mounted on\n"
            "/dev/block/dm-48 110745468 52316604 58297792      48% /data\n",
            58297792,
        ),
        (
            "Filesystem 1024-blocks Used Available Capacity Mounted on\n"
            "/dev/mapper/a-very-long-volume-name\n     524288     0    524288       0% /data\n",
            524288,
        ),
        ("df: /nope: No such file or directory\n", None),
        ("", None),
    ],
)
def test_parse_df_available(text, want):
    assert adb_parse.parse_df_available_kib(text) == want


def test_parse_sha256():
    h = "9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08"
    assert adb_parse.parse_sha256(f"{h}  /data/local/tmp/bmoe/m.gguf\n") == h.lower()
    assert adb_parse.parse_sha256("sha256sum: /x: No such file or directory") is None


def test_file_sha256(tmp_path):
    f = tmp_path / "x"
    f.write_bytes(b"test")
    assert adb_parse.file_sha256(f, chunk=3) == "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"


def _frame(kind: int, payload: bytes) -> bytes:
    return bytes([kind]) + len(payload).to_bytes(4, "little") + payload


def test_v2_stream_decodes_split_frames_into_lines_and_exit_code():
    log = io.StringIO()
    lines: list[str] = []
    s = adb_stream.V2Stream(log, lines.append)
    data = (
        _frame(1, b'BMOE_PROGRESS {"t": 1}\nBMOE_PRO')
        + _frame(2, b"warn one\n")
        + _frame(1, b'GRESS {"t": 2}\r\nlast without newline')
        + _frame(2, b"fatal: out of memory")
        + _frame(3, bytes([3]))
        + _frame(1, b"after exit is ignored\n")
    )
    for i in range(0, len(data), 7):  # arbitrary TCP chunking
        s.feed(data[i : i + 7])
    s.flush()
    assert s.exit_code == 3
    assert lines == ['BMOE_PROGRESS {"t": 1}', 'BMOE_PROGRESS {"t": 2}', "last without newline"]
    assert list(s.stderr_tail) == ["warn one", "fatal: out of memory"]
    assert "warn one\n" in log.getvalue() and "after exit" not in log.getvalue()


def test_adb_exit_reason():
    assert adb_parse.exit_reason(3, "x\nmodel missing\n") == "engine exited 3: model missing"
    assert adb_parse.exit_reason(137, "") == "engine exited 137 (killed by SIGKILL?)"
    assert adb_parse.exit_reason(1, "") == "engine exited 1"


def _toybox_shim(bindir: Path) -> None:
    bindir.mkdir()
    real = subprocess.run(["sh", "-c", "command -v sha256sum"], capture_output=True, text=True).stdout.strip()
    (bindir / "toybox").write_text(f'#!/bin/sh\n[ "$1" = sha256sum ] || exit 99\nshift\nexec {real} "$@"\n')
    (bindir / "toybox").chmod(0o755)


def test_sha256_script_falls_back_to_toybox(tmp_path):
    f = tmp_path / "m.bin"
    f.write_bytes(b"test")
    _toybox_shim(tmp_path / "bin")
    env = {**os.environ, "PATH": str(tmp_path / "bin")}  # no sha256sum on PATH, only toybox
    r = subprocess.run(
        ["/bin/sh", "-c", adb_shell.SHA256_SCRIPT, "sh", str(f)], capture_output=True, text=True, env=env, timeout=10
    )
    assert r.returncode == 0, r.stderr
    assert adb_parse.parse_sha256(r.stdout) == adb_parse.file_sha256(f)
    r = subprocess.run(
        ["/bin/sh", "-c", adb_shell.SHA256_SCRIPT, "sh", str(f)],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": str(tmp_path / "empty")},
        timeout=10,
    )
    assert r.returncode == 127 and "no sha256sum or toybox" in r.stderr


def test_format_devices():
    assert adb_parse.format_devices([]) == ["no adb devices (adb server running, none attached or connected)"]
    devs = [
        {"serial": "R5CT1", "state": "device", "model": "samsung SM-S918B", "android_release": "14", "free_mib": 81234},
        {"serial": "emulator-5554", "state": "offline"},
    ]
    assert adb_parse.format_devices(devs) == ["R5CT1\tdevice", "emulator-5554\toffline"]
    assert adb_parse.format_devices(devs, details=True) == [
        "R5CT1\tdevice\tsamsung SM-S918B\tAndroid 14\t81234 MiB free in /data/local/tmp",
        "emulator-5554\toffline",
    ]
