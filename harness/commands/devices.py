"""`bmoe-bench devices`: the adb devices the adb server sees, their state, and (ready ones) what they are;
with `--server H:P` (repeatable), every device of every server named, a server that does not answer as
one line naming it (exit status 1)."""

from __future__ import annotations

import typer

from harness.adb_devices import device_summaries, fleet_listing, format_fleet
from harness.adb_parse import format_devices
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
    ) -> None:
        """List adb devices and their state (one line each)."""
        if not server:
            for line in format_devices(device_summaries(host=host, port=port, details=long), details=long):
                typer.echo(line)
            return
        from harness.adb_client import parse_server

        try:
            servers = [parse_server(s) for s in server]
        except ValueError as e:
            raise UserError(f"--server {e}") from None
        found, down = fleet_listing(servers)
        for line in format_fleet(found):
            typer.echo(line)
        if not found and not down:
            typer.echo("no adb devices on any of these servers")
        for line in down:
            typer.echo(line)
        if down:
            raise typer.Exit(1)
