"""The gates' fault injection is a reader wrapper (no llama.cpp needed to check it): a wrong expert's bytes
land in the slot asked for, a chosen layer raises, every other read is the real reader's."""

from __future__ import annotations

import ctypes

import pytest

from harness.engine.io.faults import Faults, InjectedFault
from harness.engine.io.reader import SliceReader
from harness.engine.model.gguf_layout import load_layout
from harness.errors import UserError
from harness.synth import ModelSpec, make_model


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    path = make_model(tmp_path_factory.mktemp("faults") / "m.gguf", ModelSpec(expert_type="q8_0", seed=41))[0]
    return load_layout(path)


def _read(reader, et, e: int) -> bytes:
    buf = ctypes.create_string_buffer(et.nb2)
    got, _ns = reader.submit(et.path, et.abs_offset + e * et.nb2, et.nb2, ctypes.addressof(buf)).result()
    assert got == et.nb2
    return buf.raw


def _file_slice(et, e: int) -> bytes:
    with open(et.path, "rb") as f:
        f.seek(et.abs_offset + e * et.nb2)
        return f.read(et.nb2)


def test_wrong_expert_loads_the_other_experts_bytes_and_only_there(layout):
    inner = SliceReader(layout.shards, 2, odirect=False)
    r = Faults(wrong_expert=(1, 3, 5)).wrap(inner, layout)
    try:
        for et in layout.by_layer[1]:
            assert _read(r, et, 3) == _file_slice(et, 5) != _file_slice(et, 3)
            assert _read(r, et, 4) == _file_slice(et, 4)
        for et in layout.by_layer[0]:
            assert _read(r, et, 3) == _file_slice(et, 3)
    finally:
        r.close()


def test_fail_at_layer_raises_on_that_layers_first_read(layout):
    r = Faults(fail_at_layer=2).wrap(SliceReader(layout.shards, 1, odirect=False), layout)
    try:
        et = layout.by_layer[2][0]
        with pytest.raises(InjectedFault, match="test fault injected at layer 2"):
            _read(r, et, 0)
        assert _read(r, layout.by_layer[1][0], 0) == _file_slice(layout.by_layer[1][0], 0)
    finally:
        r.close()


def test_faults_come_from_the_environment_only_when_asked():
    assert Faults.from_env({}) is None
    assert Faults.from_env({"BMOE_TEST_WRONG_EXPERT": "1,3,5"}) == Faults(wrong_expert=(1, 3, 5))
    assert Faults.from_env({"BMOE_TEST_FAIL_AT_LAYER": "2"}) == Faults(fail_at_layer=2)
    with pytest.raises(UserError, match="layer,expert,wrong"):
        Faults.from_env({"BMOE_TEST_WRONG_EXPERT": "1,3"})
