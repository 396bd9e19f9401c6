"""`bmoe-bench devices`: the adb devices the adb server sees, their state, and (ready ones) what they are;
with `--server H:P` (repeatable), every device of every server named, a server that does not answer as
one line naming it (exit status 1); with --campaign, the SSH and Termux targets of those campaign files too
(harness.commands.ssh_devices)."""

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
    ) -> None:
        """List adb devices and their state (one line each), and the SSH targets of --campaign files."""
        from harness.devices.timeouts import command_limits

        with command_limits(device_timeout):
            _devices(long, host, port, server, campaign)


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
