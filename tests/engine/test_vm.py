"""Reservations: address congruence for O_DIRECT, and eviction that releases only whole pages of a slice."""

from __future__ import annotations

import ctypes

from harness.engine.io.vm import PAGE, Reservation


def _fill(res: Reservation, start: int, n: int, byte: int) -> None:
    ctypes.memset(res.addr_of(start), byte, n)


def _get(res: Reservation, pos: int) -> int:
    return ctypes.c_ubyte.from_address(res.addr_of(pos)).value


def test_data_address_is_congruent_to_the_file_offset():
    for off in (0, 32, 4064, 4096 + 96, 123456):
        r = Reservation(10 * PAGE, off)
        assert r.data % PAGE == off % PAGE
        assert r.data >= r.base + PAGE  # room for the superset of the first slice


def test_release_keeps_pages_shared_with_a_neighbour():
    off = 1000  # a 32-byte-aligned tensor start that is not page aligned, like in a GGUF
    slice_len = 3 * PAGE + 200
    r = Reservation(4 * slice_len, off)
    for e in range(4):
        _fill(r, off + e * slice_len, slice_len, 0x11 * (e + 1))
    # evict expert 1: only pages wholly inside its slice go; its neighbours' bytes all stay
    s1 = off + slice_len
    released = r.release(s1, s1 + slice_len)
    assert released > 0 and released % PAGE == 0 and released <= slice_len
    for pos in (off, s1 - 1, s1 + slice_len, off + 3 * slice_len, off + 4 * slice_len - 1):
        e = (pos - off) // slice_len
        if e != 1:
            assert _get(r, pos) == 0x11 * (e + 1), f"byte {pos} of resident expert {e} was released"
    # the released range reads back as zeros; the boundary bytes of expert 1 that share a page survive
    first_full = (r.addr_of(s1) + PAGE - 1) // PAGE * PAGE
    assert ctypes.c_ubyte.from_address(first_full).value == 0
    assert _get(r, s1) == 0x22  # lies on a page shared with expert 0: kept


def test_release_of_a_slice_smaller_than_a_page_releases_nothing():
    r = Reservation(4 * PAGE, 64)
    _fill(r, 64, 3 * PAGE, 0x5A)
    assert r.release(64 + 100, 64 + 100 + PAGE - 1) == 0
    assert _get(r, 64 + 100) == 0x5A
