"""`bmoe-bench devices`: the adb devices the adb server sees, their state, and (ready ones) what they are;
with `--server H:P` (repeatable), every device of every server named, a server that does not answer as
one line naming it (exit status 1); with --campaign, the SSH and Termux targets of those campaign files too
(harness.commands.ssh_devices). `--restore FOLDER` puts back the devices a campaign folder's preparation left
changed (its prepared/ journals: harness.campaigns.prepared), e.g. after the host running it was killed."""

from __future__ import annotations

import typer

from harness.devices.listing import device_summaries, fleet_listing, format_fleet
from harness.devices.parse import format_devices
from harness.errors import UserError


def register(app: typer.Typer) -> None:
    @app.command("devices")
    def devices(
        long: bool = typer.Option(
            False, "--long", "-l", help="Also ask each ready device for its model, Android version and free space."
        ),
        host: str = typer.Option("127.0.0.1", help="adb server host."),
        port: int = typer.Option(5037, help="adb server port."),
        server: list[str] = typer.Option([], "--server", metavar="HOST:PORT", help=(
            "an adb server (repeatable): list every device of every one with model, SoC, RAM, Android "
            "version, fingerprint and state")),
        campaign: list[str] = typer.Option([], "--campaign", "-c", help=(
            "Also list the ssh or termux target of this campaign file (repeatable): does it answer, which bmoe "
            "is deployed there.")),
        device_timeout: float | None = typer.Option(None, "--device-timeout", metavar="S", min=1.0, help=(
            "the longest one exchange with a server may take (default 30 s; silent for half as long, at most "
            "15 s, is stalled): a server that trickles or stalls is named in one line")),
        restore: str | None = typer.Option(None, "--restore", metavar="FOLDER", help=(
            "put back every device a campaign folder's preparation left changed (its prepared/*.json journals, "
            "e.g. after the host was killed) instead of listing; exit 1 if one could not be")),
    ) -> None:
        """List adb devices and their state (one line each), and the SSH targets of --campaign files; or, with
        --restore FOLDER, put back the devices a campaign folder's preparation left changed."""
        from harness.devices.timeouts import command_limits

        with command_limits(device_timeout):
            if restore is not None:
                _restore(restore)
                return
            _devices(long, host, port, server, campaign)


def _restore(folder: str) -> None:
    from pathlib import Path

    from rich.console import Console

    from harness.campaigns.prepared import restore_folder
    from harness.campaigns.store import lock_folder
    from harness.devices.adb import Device

    d = Path(folder)
    if not d.is_dir():
        raise UserError(f"--restore {folder}: no such campaign folder")
    lock = lock_folder(d)  # a campaign still running there keeps its devices prepared: refused, naming it
    try:
        failed = restore_folder(d, Console(stderr=False, highlight=False),
                                lambda serial, host, port: Device(serial, host=host, port=port))
    finally:
        lock.release()
    if failed:
        raise typer.Exit(1)


def _devices(long: bool, host: str, port: int, server: list[str], campaign: list[str]) -> None:
    extra: list[str] = []
    if campaign:
        from harness.commands.ssh_devices import target_lines

        extra = target_lines(campaign, details=long)
    if not server:
        try:
            lines = format_devices(device_summaries(host=host, port=port, details=long), details=long)
        except UserError as e:
            if not campaign:
                raise
            lines = [f"adb: {e}"]
        for line in lines + extra:
            typer.echo(line)
        return
    from harness.devices.adb_client import parse_server

    try:
        servers = [parse_server(s) for s in server]
    except ValueError as e:
        raise UserError(f"--server {e}") from None
    found, down = fleet_listing(servers)
    for line in [*format_fleet(found), *extra]:
        typer.echo(line)
    if not found and not down:
        typer.echo("no adb devices on any of these servers")
    for line in down:
        typer.echo(line)
    if down:
        raise typer.Exit(1)
