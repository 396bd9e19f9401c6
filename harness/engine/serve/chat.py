"""`bmoe chat -m MODEL [engine flags]`: an interactive terminal chat (rich) on one loaded engine, with a live
panel under the reply: decode tok/s, flash I/O against compute per token, cache hit %, MiB read per token, RSS
and MemAvailable. Ctrl-C stops the reply, not the chat (a second Ctrl-C within the same reply leaves); Ctrl-D
or /quit leaves; /reset starts a new conversation; /n N sets the reply length (-n). The history goes through
the model's own chat template, and the KV prefix and the expert cache stay warm across turns
(harness.engine.serve.turns).
"""

from __future__ import annotations

import dataclasses
import os
import select
import signal
import sys
from dataclasses import dataclass

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from harness.engine.run.engine import Engine
from harness.engine.serve.turns import Conversation, Delta, sampling_of
from harness.errors import UserError
from harness.formats.metrics_csv import TokenRow

MIB = 1048576


@dataclass
class Meter:
    """Running totals of one reply's token rows, for the panel."""

    n: int = 0
    wall_ms: float = 0.0
    io_ms: float = 0.0
    compute_ms: float = 0.0
    read_bytes: int = 0
    io_known: bool = True
    last: TokenRow | None = None

    def add(self, row: TokenRow) -> None:
        self.n += 1
        self.wall_ms += row.wall_ms
        if row.io_ms >= 0:
            self.io_ms += row.io_ms
            self.compute_ms += row.compute_ms
        else:
            self.io_known = False
        if row.read_bytes > 0:
            self.read_bytes += row.read_bytes
        self.last = row

    def cells(self) -> list[tuple[str, str]]:
        n = max(self.n, 1)
        r = self.last

        def mib(v: float) -> str:
            return f"{v:.0f} MiB" if v >= 0 else "n/a"

        io = f"{self.io_ms / n:.1f} ms" if self.io_known and self.n else "n/a (mmap)"
        comp = f"{self.compute_ms / n:.1f} ms" if self.io_known and self.n else f"{self.wall_ms / n:.1f} ms (all)"
        hit = f"{r.cache_hit_pct:.1f} %" if r is not None and r.cache_hit_pct >= 0 else "n/a"
        return [("tok/s", f"{1e3 * self.n / self.wall_ms:.2f}" if self.wall_ms > 0 else "-"),
                ("tokens", str(self.n)), ("flash I/O", io), ("compute", comp), ("hit", hit),
                ("MiB read", f"{self.read_bytes / MIB / n:.3f}"),
                ("RSS", mib(r.rss_mib) if r else "-"), ("MemAvailable", mib(r.mem_available_mib) if r else "-")]


def panel(m: Meter, note: str = "") -> Panel:
    t = Table.grid(padding=(0, 1))
    cells = m.cells()
    t.add_row(*(Text(k, style="dim") for k, _ in cells))
    t.add_row(*(Text(v, style="bold") for _, v in cells))
    return Panel(t, title="bmoe" + (f" - {note}" if note else ""), subtitle="I/O, compute, MiB read: per token",
                 title_align="left", subtitle_align="right", expand=False)


class _Stop:
    """SIGINT during a reply: set a flag checked between tokens (never raise inside llama.cpp's callback)."""

    def __init__(self) -> None:
        self.hit = 0

    def __call__(self, signum, frame) -> None:
        self.hit += 1
        if self.hit > 1:
            sys.stderr.write("\nbmoe: interrupted twice: leaving\n")
            os._exit(130)


def read_line(console: Console, prompt: str) -> str:
    """The user's next line. A Ctrl-C that lands after Python's last signal check inside input() and before its
    read() blocks is only a flag the blocked read never sees (the prompt ignored it until the next Enter; a
    loaded clean-clone CI run showed it): so wait for a whole line (or Ctrl-D) in short selects, which run the
    pending handler every 0.1 s, and call input() only when its read cannot block."""
    console.print(prompt, end="")
    try:
        fd = sys.stdin.fileno() if sys.stdin.isatty() else -1
    except (AttributeError, OSError, ValueError):
        fd = -1
    # only a terminal: a pipe's later lines may already sit in sys.stdin's buffer, where select cannot see them
    while fd >= 0 and not select.select([fd], [], [], 0.1)[0]:
        pass
    return input()


def chat(engine: Engine, console: Console | None = None) -> int:
    console = console or Console()
    conv = Conversation(engine)
    if not engine.layout.chat_template:
        raise UserError(f"{engine.cfg.model} has no chat template (tokenizer.chat_template); bmoe chat needs one")
    history: list[dict[str, str]] = []
    sp = sampling_of(engine.cfg)
    console.print(f"[bold]bmoe chat[/] {os.path.basename(engine.cfg.model)} ({engine.layout.arch}, "
                  f"{'streamed' if engine.cfg.moe_stream else 'mmap'}). Ctrl-C stops a reply; Ctrl-D or /quit leaves; "
                  "/reset forgets the conversation; /n N sets the reply length.")
    while True:
        try:
            line = read_line(console, "[bold green]you>[/] ")
        except EOFError:
            console.print()
            return 0
        except KeyboardInterrupt:
            console.print("\n(Ctrl-D or /quit leaves)")
            continue
        text = line.strip()
        if not text:
            continue
        if text in ("/quit", "/exit"):
            return 0
        if text.startswith("/n "):
            try:
                n = int(text[3:])
                if n < 1:
                    raise ValueError
            except ValueError:
                console.print("(/n takes a number of tokens >= 1)")
                continue
            sp = dataclasses.replace(sp, n_predict=n)
            console.print(f"(replies up to {n} tokens)")
            continue
        if text == "/reset":
            history = []
            console.print("(new conversation)")
            continue
        history.append({"role": "user", "content": text})
        try:
            tokens = conv.prompt_tokens(messages=history, n_predict=sp.n_predict)
            conv.check_fits(tokens, sp.n_predict)
        except UserError as e:
            console.print(f"[red]bmoe: {e}[/]")
            history.pop()
            continue
        reply = reply_once(conv, tokens, sp, console)
        history.append({"role": "assistant", "content": reply})


TAIL_CHARS = 2000  # the live view renders only the reply's end (rendering all of a long reply 8 times a second
# would hold the GIL the eval callback needs); the whole reply is printed once it ends


def reply_once(conv: Conversation, tokens: list[int], sp, console: Console) -> str:
    stop = _Stop()
    old = signal.signal(signal.SIGINT, stop)
    meter = Meter()
    parts: list[str] = []
    tail = [""]

    def view(note: str = "") -> Group:
        return Group(Text(tail[0]), panel(meter, note))

    try:
        with Live(view(), console=console, refresh_per_second=4, transient=True,
                  vertical_overflow="crop") as live:
            def on(d: Delta) -> None:
                meter.add(d.row)
                parts.append(d.text)
                if len(parts) % 4 == 1 or len(tail[0]) < TAIL_CHARS:
                    tail[0] = "".join(parts)[-TAIL_CHARS:]
                live.update(view())

            res = conv.run(tokens, sp, cancel=lambda: stop.hit > 0, on_delta=on)
    finally:
        signal.signal(signal.SIGINT, old)
    note = {"cancelled": "stopped (Ctrl-C)", "stop": "end of reply", "length": f"{sp.n_predict} tokens (-n)"}
    console.print(Text(res.text))
    console.print(panel(meter, note[res.finish]))
    return res.text
