"""`bmoe-bench deploy TARGET`: bmoe at the harness's own version in a venv on an SSH or Termux target
(harness.deploy.venv). TARGET is a campaign file (its target), `[user@]host[:port]`, or `termux[:SERIAL]`."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.errors import UserError

SOURCES = ("auto", "harness", "target")


def target_spec(target: str, *, identity_file: str | None, known_hosts: str | None, dir: str | None):
    """The TargetSpec TARGET names (harness.formats.campaign); options given override a campaign's."""
    from harness.formats.campaign import TargetSpec

    over = {k: v for k, v in (("identity_file", identity_file), ("known_hosts", known_hosts), ("dir", dir)) if v}
    if target.endswith((".yaml", ".yml")) or Path(target).is_file():
        from harness.campaigns.schema import load_campaign

        t = load_campaign(target).target
        if t.kind not in ("ssh", "termux"):
            raise UserError(f"{target}: its target is {t.kind}; deploy is for targets ssh and termux")
        return t.model_copy(update=over)
    if target == "termux" or target.startswith("termux:"):
        return TargetSpec(kind="termux", serial=target.partition(":")[2] or None, **over)
    user, _, rest = target.rpartition("@")
    host, _, port = rest.partition(":")
    if not host or (port and not port.isdigit()):
        raise UserError(f"deploy target {target!r}: give a campaign file, [user@]host[:port] or termux[:SERIAL]")
    return TargetSpec(kind="ssh", host=host, port=int(port) if port else None, user=user or None, **over)


def register(app: typer.Typer) -> None:
    @app.command("deploy")
    def deploy_cmd(
        target: str = typer.Argument(..., help="A campaign file (its ssh or termux target), [user@]host[:port], "
                                               "or termux[:SERIAL]."),
        identity_file: str = typer.Option(None, "--identity-file", "-i", help="Private key for ssh."),
        known_hosts: str = typer.Option(None, "--known-hosts", help="A known_hosts file of its own."),
        dir: str = typer.Option(None, "--dir", help="The folder there (default ~/bmoe)."),
        python: str = typer.Option("python3", "--python", help="The Python 3.11+ there that makes the venv."),
        source: str = typer.Option("auto", "--from", help=(
            "Where llama-cpp-python and the other dependencies come from: harness (this environment's own, when "
            "the target can run them), target (its package index; llama-cpp-python built there), auto.")),
        system_site_packages: bool = typer.Option(False, "--system-site-packages", help=(
            "Let the venv see the target's system packages (Termux: pkg's python-numpy and friends).")),
    ) -> None:
        """Put bmoe, at this harness's version, with llama-cpp-python built without llamafile, in a venv on an
        SSH or Termux target; nothing is done when it is there already."""
        from harness.deploy.venv import deploy
        from harness.targets.ssh import ssh_target

        if source not in SOURCES:
            raise UserError(f"--from {source!r}: give one of {', '.join(SOURCES)}")
        t = ssh_target(target_spec(target, identity_file=identity_file, known_hosts=known_hosts, dir=dir))
        try:
            changed, secs = deploy(t.link, t.dir, python=python, source=source,
                                   system_site_packages=system_site_packages, say=typer.echo)
        finally:
            t.close()
        typer.echo(f"deploy: {'done' if changed else 'nothing done'} in {secs:.1f} s")
