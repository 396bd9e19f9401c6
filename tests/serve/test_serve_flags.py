"""`bmoe serve`'s own flags and its door (harness.engine.serve.subcommands, .guard), pure: the body limit, the API
key (flag or BMOE_API_KEY), the Host allow-list and how a Host header is read."""

from __future__ import annotations

import pytest

from harness.engine.serve.guard import door_of, host_name, is_loopback
from harness.engine.serve.subcommands import ServeFlags, split
from harness.errors import UserError


def test_defaults_and_the_key_from_the_environment():
    _, rest, f = split(["serve", "-m", "x.gguf"], env={})
    assert rest == ["-m", "x.gguf"] and f == ServeFlags() and f.max_body_kb == 1024 and f.api_key == ""
    assert split(["serve"], env={"BMOE_API_KEY": "k1"})[2].api_key == "k1"
    assert split(["serve", "--api-key", "k2"], env={"BMOE_API_KEY": "k1"})[2].api_key == "k2"  # the flag wins
    f = split(["serve", "--max-body-kb", "64", "--allow-host", "a.test", "--allow-host", "b.test"], env={})[2]
    assert f.max_body_kb == 64 and f.allow_hosts == ("a.test", "b.test")


@pytest.mark.parametrize("argv, says", [
    (["--max-body-kb", "0"], "--max-body-kb must be >= 1"),
    (["--api-key", ""], "--api-key is empty"),
    (["--api-key", "has space"], "printable ASCII"),
    (["--allow-host", " "], "--allow-host needs a name"),
])
def test_bad_flags_are_one_line(argv, says):
    with pytest.raises(UserError, match=says):
        split(["serve", *argv], env={})


def test_host_names_and_the_allow_list():
    assert [host_name(h) for h in ("LocalHost:8080", "[::1]:80", "127.0.0.1", "example.com.", "[::1]")] == \
        ["localhost", "::1", "127.0.0.1", "example.com", "::1"]
    d = door_of("127.0.0.1", (), 1024, "")
    assert d.max_body == 1 << 20 and d.hosts == {"localhost", "127.0.0.1", "::1"}
    assert door_of("10.0.0.5", ("Box.Lan",), 8, "").hosts == {"localhost", "127.0.0.1", "::1", "10.0.0.5", "box.lan"}
    assert door_of("0.0.0.0", (), 8, "").hosts == {"localhost", "127.0.0.1", "::1"}  # a wildcard names no host
    assert door_of("0.0.0.0", ("*",), 8, "").hosts is None
    assert is_loopback("127.0.0.2") and is_loopback("::1") and not is_loopback("0.0.0.0")
