"""`bmoe-bench devices`: the adb devices the adb server sees, their state, and (ready ones) what they are; with
--campaign, the SSH and Termux targets of those campaign files too (harness.commands.ssh_devices)."""

from __future__ import annotations

import typer

from harness.adb import device_summaries
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
        campaign: list[str] = typer.Option([], "--campaign", "-c", help=(
            "Also list the ssh or termux target of this campaign file (repeatable): does it answer, which bmoe "
            "is deployed there.")),
    ) -> None:
        """List adb devices and their state (one line each), and the SSH targets of --campaign files."""
        try:
            lines = format_devices(device_summaries(host=host, port=port, details=long), details=long)
        except UserError as e:
            if not campaign:
                raise
            lines = [f"adb: {e}"]
        if campaign:
            from harness.commands.ssh_devices import target_lines

            lines += target_lines(campaign, details=long)
        for line in lines:
            typer.echo(line)
