"""The management clocks (harness.engine.stream.common.settle): the compute thread's CPU time inside a management
section is read inside the section's wall interval, so its CPU never exceeds its wall, however slowly the thread runs
between the clock reads. Under an emulator every bytecode is slow; with the CPU clock read after the wall clock at a
section's end, tests/gates/test_engine_gates.py's check of every token's mgmt_cpu_ms <= mgmt_ms failed under
qemu-user (bench-data/2026-12-03-arm-gates). Here a trace function makes each bytecode cost real CPU time."""

from __future__ import annotations

import sys
import time

from harness.engine.stream.common import TokenCounters, settle

SLOW_NS = 100_000  # the thread's CPU time each traced bytecode costs


def _slow(frame, event, arg):
    """A trace function that spends SLOW_NS of the thread's CPU before every bytecode of the frames it traces."""
    if event == "call":
        frame.f_trace_opcodes = True
    elif event == "opcode":
        end = time.thread_time_ns() + SLOW_NS
        while time.thread_time_ns() < end:
            pass
    return _slow


def _section(c: TokenCounters) -> None:
    t0, c0 = time.perf_counter_ns(), time.thread_time_ns()  # as the hook's stages open a section
    settle(c, t0, c0)


def test_a_sections_cpu_stays_inside_its_wall_on_a_slow_interpreter() -> None:
    seen: list[tuple[int, int]] = []
    before = sys.gettrace()
    sys.settrace(_slow)
    try:
        for _ in range(5):
            c = TokenCounters()
            _section(c)
            seen.append((c.mgmt_cpu_ns, c.mgmt_ns))
    finally:
        sys.settrace(before)
    assert all(cpu >= SLOW_NS for cpu, _ in seen), f"the slowed bytecodes were not inside the sections: {seen}"
    assert all(cpu <= wall for cpu, wall in seen), f"CPU above wall (ns): {seen}"
