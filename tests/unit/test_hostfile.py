from __future__ import annotations

import pytest
from gaudi_cluster.errors import ConfigError
from gaudi_cluster.nodes.hostfile import (
    HostEntry,
    Hostfile,
    make_hostfile,
    parse_hostfile,
    render_hostfile,
    render_mpi_hosts,
)
from gaudi_cluster.nodes.world import read_hostfile
from hypothesis import given
from hypothesis import strategies as st


def hf(*pairs: tuple[str, int]) -> Hostfile:
    return Hostfile(tuple(HostEntry(h, s) for h, s in pairs))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("a slots=2\nb slots=4\n", hf(("a", 2), ("b", 4)), id="plain"),
        pytest.param(
            "# nodes\n\na slots=8  # trailing\n   \nb slots=8", hf(("a", 8), ("b", 8)), id="comments"
        ),
        pytest.param("10.0.0.1\tslots=1\n", hf(("10.0.0.1", 1)), id="tab-ip"),
        pytest.param("a max_slots=4 slots=2\n", hf(("a", 2)), id="max-slots-first"),
        pytest.param("a slots=2 max_slots=2\n", hf(("a", 2)), id="max-slots-equal"),
        pytest.param("fe80::1 slots=2\n", hf(("fe80::1", 2)), id="ipv6"),
        pytest.param("b slots=1\na slots=1\n", hf(("b", 1), ("a", 1)), id="order-kept"),
        pytest.param("a slots=08\n", hf(("a", 8)), id="leading-zero"),
    ],
)
def test_parse_ok(text, expected):
    assert parse_hostfile(text) == expected


@pytest.mark.parametrize(
    ("text", "culprit"),
    [
        pytest.param("", "hf:1", id="empty"),
        pytest.param("# only a comment\n\n", "hf:1", id="only-comments"),
        pytest.param("a slots=2\na slots=4\n", "hf:2", id="duplicate"),
        pytest.param("a\n", "hf:1", id="missing-slots"),
        pytest.param("a slots=0\n", "hf:1", id="zero"),
        pytest.param("a slots=-1\n", "hf:1", id="negative"),
        pytest.param("a slots=two\n", "hf:1", id="non-integer"),
        pytest.param("a slots=1.5\n", "hf:1", id="float"),
        pytest.param("a slots=\n", "hf:1", id="empty-slots"),
        pytest.param("x slots=1\na slots=2 gpus=2\n", "hf:2", id="unknown-token"),
        pytest.param("a slots=2 extra\n", "hf:1", id="stray-word"),
        pytest.param("a slots=4 max_slots=2\n", "hf:1", id="max-below-slots"),
        pytest.param("a slots=2 slots=3\n", "hf:1", id="slots-twice"),
        pytest.param("root@a slots=2\n", "hf:1", id="user-at-host"),
        pytest.param("slots=2\n", "hf:1", id="no-host"),
        pytest.param("a/b slots=2\n", "hf:1", id="bad-host-char"),
        pytest.param("a slots=\u00b2\n", "hf:1", id="superscript-digit"),
    ],
)
def test_parse_errors(text, culprit):
    with pytest.raises(ConfigError) as exc:
        parse_hostfile(text, "hf")
    msg = str(exc.value)
    assert msg.startswith(culprit + ":")
    assert "fix:" in msg
    assert "\n" not in msg


def test_user_at_host_says_where_user_comes_from():
    with pytest.raises(ConfigError, match="ssh config"):
        parse_hostfile("root@a slots=2\n")


def test_duplicate_names_first_line():
    with pytest.raises(ConfigError, match="line 1"):
        parse_hostfile("a slots=2\nb slots=1\na slots=4\n")


def test_hostfile_properties():
    h = hf(("a", 2), ("b", 3))
    assert h.hosts == ("a", "b")
    assert h.world_size == 5


def test_read_hostfile_missing_is_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"does not exist.*fix:"):
        read_hostfile(tmp_path / "nope")


def test_read_hostfile_names_path(tmp_path):
    p = tmp_path / "hostfile"
    p.write_text("a slots=2\nb slots=x\n")
    with pytest.raises(ConfigError, match=f"^{p}:2: "):
        read_hostfile(p)
    p.write_text("a slots=2\n")
    assert read_hostfile(str(p)) == hf(("a", 2))


def test_make_hostfile_master_first_rest_in_order():
    entries = [HostEntry("w2", 2), HostEntry("m", 4), HostEntry("w1", 2)]
    assert make_hostfile(entries, master="m").hosts == ("m", "w2", "w1")
    assert make_hostfile(entries).hosts == ("w2", "m", "w1")


@pytest.mark.parametrize(
    ("entries", "master", "match"),
    [
        pytest.param([HostEntry("a", 1), HostEntry("a", 2)], None, "twice", id="duplicate"),
        pytest.param([HostEntry("a", 0)], None, "at least 1 slot", id="zero-slots"),
        pytest.param([HostEntry("a", 1)], "m", "not among", id="unknown-master"),
        pytest.param([], None, "empty", id="empty"),
        pytest.param([HostEntry("u@a", 1)], None, "ssh config", id="user-at"),
    ],
)
def test_make_hostfile_errors(entries, master, match):
    with pytest.raises(ConfigError, match=match) as exc:
        make_hostfile(entries, master=master)
    assert "fix:" in str(exc.value)


def test_render_golden():
    h = hf(("m", 4), ("w1", 2))
    assert render_hostfile(h) == "m slots=4\nw1 slots=2\n"
    assert render_mpi_hosts(h) == "m:4,w1:2"


_hosts = st.from_regex(r"[a-z][a-z0-9.-]{0,15}", fullmatch=True)
_entries = st.lists(st.tuples(_hosts, st.integers(1, 1024)), min_size=1, max_size=8, unique_by=lambda t: t[0])


@given(_entries)
def test_round_trip(pairs):
    h = hf(*pairs)
    assert parse_hostfile(render_hostfile(h)) == h


@pytest.mark.parametrize("host", ["-oProxyCommand=sh", "-w", "--"])
def test_a_host_that_reads_as_an_option_is_refused(host):
    from gaudi_cluster.nodes.hostfile import host_problem

    assert "starts with '-'" in str(host_problem(host))
    with pytest.raises(ConfigError, match="starts with '-"):
        parse_hostfile(f"{host} slots=1\n", "hf")
