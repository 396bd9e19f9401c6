"""`bmoe-bench devices`: the adb devices the adb server sees, their state, and (ready ones) what they are."""

from __future__ import annotations

import typer

from harness.adb import device_summaries
from harness.adb_parse import format_devices


def register(app: typer.Typer) -> None:
    @app.command("devices")
    def devices(
        long: bool = typer.Option(
            False, "--long", "-l", help="Also ask each ready device for its model, Android version and free space."
        ),
        host: str = typer.Option("127.0.0.1", help="adb server host."),
        port: int = typer.Option(5037, help="adb server port."),
    ) -> None:
        """List adb devices and their state (one line each)."""
        for line in format_devices(device_summaries(host=host, port=port, details=long), details=long):
            typer.echo(line)
