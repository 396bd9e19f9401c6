"""Campaigns over SSH against a real sshd on loopback (tests/helpers/sshd.py): `bmoe-bench deploy` twice (the
second does nothing), the Python engine from the deployed venv end to end, a target without bmoe deployed, the
sshd stopped mid-campaign (that run fails with its reason, the campaign stops in one line, nothing finished is
lost, and it resumes), the Termux target through the loopback adbd's forward, and `devices --campaign`."""

from __future__ import annotations

import json
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import pytest

from harness.campaigns.runner import run_campaign
from harness.deploy.stamp import harness_version, source_root
from harness.errors import ResourceError
from harness.formats.manifest import load_manifest, raw_file_changes
from harness.report.build import check_report, write_report
from tests.helpers.adbd import SERIAL
from tests.helpers.runner import engine, quiet
from tests.helpers.sshd import base_python, run_cli, target_yaml

pytestmark = [pytest.mark.ssh]


def test_deploy_twice_the_second_does_nothing(sshd, deployed):
    d, (rc, out, err), first_s = deployed
    assert rc == 0, err
    assert "deploy: root@127.0.0.1:8022: not deployed" in out and "deploy: done in " in out
    stamp = json.loads((d / "deploy.json").read_text())
    assert stamp["bmoe"] == harness_version() and stamp["llamafile"] is False
    assert stamp["llama_cpp_python"] == "0.3.36" and stamp["llama_from"].startswith("the harness's own build")
    before = (d / "deploy.json").stat().st_mtime_ns, (d / "venv" / "bin" / "bmoe").stat().st_mtime_ns
    t = time.monotonic()
    rc2, out2, err2 = run_cli(["deploy", f"root@127.0.0.1:{sshd.port}", "-i", str(sshd.key), "--known-hosts",
                               str(sshd.known_hosts), "--dir", str(d), "--python", base_python()])
    second_s = time.monotonic() - t
    assert rc2 == 0, err2
    assert "is up to date" in out2 and "nothing to do" in out2 and "deploy: nothing done in " in out2
    assert before == ((d / "deploy.json").stat().st_mtime_ns, (d / "venv" / "bin" / "bmoe").stat().st_mtime_ns)
    assert second_s < 10 and second_s < first_s / 3, (first_s, second_s)


def _bmoe_campaign(tmp_path: Path, target: str, name: str = "sshpy") -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(textwrap.dedent(f"""\
        name: {name}
        model: {{recipe: {{shape: tiny}}}}
        target: {target}
        engine: bmoe
        flags: {{-t: 1, -c: 128}}
        axes:
          - name: mode
            values: {{mmap: {{}}, streamed: {{--moe-stream: true}}}}
        repeats: 1
        tokens: 4
        cooldown: {{mem_available_min_mib: 64, max_wait_s: 5}}
        timeout_s: 300
        """))
    return p


def test_a_campaign_with_the_python_engine_over_ssh(sshd, deployed, tmp_path):
    d = deployed[0]
    p = _bmoe_campaign(tmp_path, target_yaml(sshd, d))
    res = run_campaign(p, root=tmp_path / "bd", console=quiet())
    assert (res.n_ok, res.n_failed) == (2, 0)
    m = load_manifest(res.folder)
    assert m.target.kind == "ssh" and m.target.host == "127.0.0.1" and m.target.dir == str(d)
    assert m.engine.argv0 == [f"{d}/venv/bin/bmoe"] and m.engine.version.startswith("bmoe ")
    assert m.provenance.device.kind == "ssh" and m.provenance.engines["bmoe"].llama_cpp
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=source_root(), capture_output=True, text=True).stdout
    assert m.provenance.engines["bmoe"].commit == head.strip()  # the tree deployed from, not a venv's own
    for r in m.runs:
        assert r.argv[0] == f"{d}/venv/bin/bmoe" and r.argv[2].startswith(f"{d}/files/")  # the staged model
        assert r.tokens == 4 and r.n_state_samples >= 1 and r.entry_state.mem_available_mib > 0
    assert raw_file_changes(res.folder, m) == []
    write_report(res.folder)
    assert check_report(res.folder) == []


def test_a_target_without_bmoe_deployed_is_refused_in_one_line(sshd, tmp_path):
    p = _bmoe_campaign(tmp_path, target_yaml(sshd, tmp_path / "empty"), name="nodeploy")
    rc, _, err = run_cli(["run", str(p), "--out", str(tmp_path / "bd")])
    lines = err.strip().splitlines()
    assert rc == 2 and "Traceback" not in err and lines[-1].startswith("Error: ssh target "), err
    assert "bmoe is not deployed in" in lines[-1] and f"run `bmoe-bench deploy {p}`" in lines[-1]
    (tmp_path / "empty" / "deploy.json").write_text('{"bmoe": "0.1.0+src.000000000000"}\n')  # another version
    rc, _, err = run_cli(["run", str(p), "--out", str(tmp_path / "bd")])
    assert rc == 2 and err.strip().splitlines()[-1] == (
        f"Error: ssh target root@127.0.0.1:8022: bmoe 0.1.0+src.000000000000 is deployed in {tmp_path / 'empty'}, "
        f"the harness is {harness_version()}; run `bmoe-bench deploy {p}`")


def test_a_wrong_key_stops_a_campaign_in_one_line(sshd, tmp_path):
    p = _bmoe_campaign(tmp_path, target_yaml(sshd, tmp_path / "t", identity_file=str(sshd.wrong_key)), name="wk")
    rc, _, err = run_cli(["run", str(p), "--out", str(tmp_path / "bd")])
    lines = err.strip().splitlines()
    assert rc == 2 and "Traceback" not in err and "Permission denied (publickey)" in lines[-1], err


def _external_campaign(tmp_path: Path, target: str, name: str, repeats: int = 2) -> Path:
    exe = engine(tmp_path)
    model = tmp_path / "model.bin"
    model.write_bytes(b"\0" * 4096)
    p = tmp_path / f"{name}.yaml"
    p.write_text(textwrap.dedent(f"""\
        name: {name}
        model: {{push_from: {model}}}
        target: {target}
        engine: {{kind: external, push_from: {exe}}}
        flags: {{--speed: 10, --sleep-ms: 300}}
        axes: [{{flag: --speed, values: [20]}}]
        repeats: {repeats}
        tokens: 4
        cooldown: {{mem_available_min_mib: 64, max_wait_s: 5}}
        timeout_s: 120
        """))
    return p


def test_sshd_stopped_mid_campaign_fails_that_run_stops_and_resumes(sshd, tmp_path):
    d = tmp_path / "there"
    p = _external_campaign(tmp_path, target_yaml(sshd, d), "gone")

    def cut() -> None:  # during the second run: the first is committed, the next one's PID file is there
        while not list((tmp_path / "bd").glob("*/runs/r01-c00")) or not list((d / "runs").glob(".bmoe-*.pid")):
            time.sleep(0.05)
        time.sleep(0.3)
        sshd.stop()

    killer = threading.Thread(target=cut)
    killer.start()
    try:
        with pytest.raises(ResourceError) as e:
            run_campaign(p, root=tmp_path / "bd", console=quiet())
        killer.join()
    finally:
        if sshd.proc is None:
            sshd.start()
    assert "\n" not in str(e.value) and "root@127.0.0.1:8022" in str(e.value)
    folder = next((tmp_path / "bd").iterdir())
    m = load_manifest(folder)
    assert [r.status for r in m.runs] == ["ok", "failed", "pending", "pending"]
    assert m.runs[1].reason.startswith("device gone: root@127.0.0.1:8022") and m.status.startswith("stopped")
    assert raw_file_changes(folder, m) == []
    res = run_campaign(p, root=tmp_path / "bd", console=quiet())  # back: the rest runs, nothing is repeated
    assert res.folder == folder and (res.n_ok, res.n_failed, res.n_skipped) == (3, 1, 2)


@pytest.mark.adb
def test_a_termux_target_through_the_adb_forward(sshd, tmp_path):
    from harness.devices.adb import Device

    t = target_yaml(sshd, tmp_path / "phone", kind="termux", host=None, port=None, serial=f'"{SERIAL}"')
    p = _external_campaign(tmp_path, t, "termux", repeats=1)
    res = run_campaign(p, root=tmp_path / "bd", console=quiet())
    assert (res.n_ok, res.n_failed) == (2, 0)
    m = load_manifest(res.folder)
    assert m.target.kind == "ssh" and m.target.host == "127.0.0.1" and m.target.port != 8022
    assert m.target.via.startswith(f"termux on {SERIAL} (adb forward tcp:")
    assert not [f for f in Device(SERIAL)._dev.forward_list() if f.remote == "tcp:8022"]  # removed at the end


def test_devices_lists_the_ssh_target_of_a_campaign(sshd, deployed, tmp_path):
    d = deployed[0]
    p = _bmoe_campaign(tmp_path, target_yaml(sshd, d), name="dev")
    rc, out, err = run_cli(["devices", "--campaign", str(p)])
    assert rc == 0, err
    line = next(x for x in out.splitlines() if x.startswith("ssh "))
    assert line.split("\t")[:3] == ["ssh root@127.0.0.1:8022", "ready", f"bmoe {harness_version()} (the harness's)"]
    q = _bmoe_campaign(tmp_path, target_yaml(sshd, d, port="8023"), name="unreachable")
    rc, out, _ = run_cli(["devices", "--campaign", str(q)])
    assert rc == 0 and "ssh root@127.0.0.1:8023\tunreachable\t" in out and "Connection refused" in out
