"""The HPU scale-out rules: which preset `auto` picks, HCCL_SOCKET_IFNAME, Gaudi Direct without OFI,
and the doctor's driver, fabric and interface checks. Pure: probe reports and routes are given."""

from __future__ import annotations

import json

import pytest
from gaudi_cluster.env import presets
from gaudi_cluster.env.jobenv import UserEnvFile, choose_preset, describe, job_env
from gaudi_cluster.errors import ConfigError
from gaudi_cluster.nodes.checks import Finding, blocking, check_nodes
from gaudi_cluster.wire.node_report import Interface

from tests.support.reports import as_report, as_reports

EFA_NODE = {"uverbs_devices": ["/dev/infiniband/uverbs0"], "efa_provider": True}
INTERFACES = [
    Interface("lo", ("127.0.0.1",)),
    Interface("eth0", ("10.0.0.1",)),
    Interface("tunl0", ("10.244.0.1",)),
    # A Gaudi NIC port in L3 mode: an IPv4 address, bound to habanalabs.
    Interface("hl0", ("192.168.100.1",), "habanalabs"),
    Interface("ib0", (), "mlx5_core"),
]


@pytest.mark.parametrize(
    ("preset", "accelerator", "report", "chosen", "why"),
    [
        ("auto", "hpu", EFA_NODE, "efa", "EFA uverbs devices and libfabric's efa provider"),
        ("auto", "hpu", {**EFA_NODE, "efa_provider": False}, "gaudinic", "no efa provider"),
        ("auto", "hpu", {**EFA_NODE, "efa_provider": None}, "gaudinic", "no fi_info"),
        ("auto", "hpu", {"uverbs_devices": [], "efa_provider": True}, "gaudinic", "no /dev/infiniband"),
        ("auto", "cpu", EFA_NODE, "cpu", "cpu ranks"),
        ("auto", "cuda", {}, "none", "cuda ranks"),
        ("hostnic", "hpu", EFA_NODE, "hostnic", "asked for"),
    ],
)
def test_the_preset_and_why(preset, accelerator, report, chosen, why):
    got, reason = choose_preset(preset, accelerator, as_report(report))
    assert got == chosen and why in reason


def test_hostnic_is_never_guessed():
    # Host IB NICs show uverbs devices and verbs, no efa: auto stays on the Gaudi NICs.
    report = {
        "uverbs_devices": ["/dev/infiniband/uverbs0"],
        "efa_provider": False,
        "fi_providers": {"verbs": True},
    }
    assert choose_preset("auto", "hpu", as_report(report))[0] == "gaudinic"


def env_for(preset="auto", report=None, environ=None, extra=None, user_files=(), ifname=None):
    return job_env(
        preset=preset,
        accelerator="hpu",
        master_report=as_report(report or {}),
        environ=environ or {},
        socket_ifname=ifname,
        extra=extra or {},
        user_files=user_files,
    )


def test_the_env_file_names_its_preset_in_the_log_lines():
    env = env_for(report=EFA_NODE)
    assert env.preset == "efa" and env.as_dict()["HCCL_OVER_OFI"] == "1"
    assert describe(env, [])[-1].startswith("env preset: efa (auto: EFA uverbs devices")


@pytest.mark.parametrize(
    ("where", "kwargs", "origin"),
    [
        ("--env", {"extra": {"HCCL_GAUDI_DIRECT": "1"}}, "--env / GAUDI_CLUSTER_ENV"),
        (
            "user file",
            {"user_files": [UserEnvFile("/w/.deepspeed_env", (("HCCL_GAUDI_DIRECT", "1"),))]},
            "/w/.deepspeed_env",
        ),
        ("master env", {"environ": {"HCCL_GAUDI_DIRECT": "1"}}, "the master's env"),
    ],
)
def test_gaudi_direct_without_ofi_is_refused_wherever_it_comes_from(where, kwargs, origin):
    with pytest.raises(ConfigError) as caught:
        env_for(preset="gaudinic", **kwargs)
    message = str(caught.value)
    assert message.startswith(f"HCCL_GAUDI_DIRECT=1 ({origin}) with HCCL_OVER_OFI unset"), message
    assert "fix: also set HCCL_OVER_OFI=1" in message and caught.value.exit_code == 2


def test_gaudi_direct_needs_over_ofi_set_to_1():
    with pytest.raises(ConfigError, match=r"HCCL_OVER_OFI 0 \(--env"):
        env_for(preset="gaudinic", extra={"HCCL_GAUDI_DIRECT": "1", "HCCL_OVER_OFI": "0"})
    # Defined at all without OFI is what HCL refuses, even =0.
    with pytest.raises(ConfigError, match="HCCL_GAUDI_DIRECT=0"):
        env_for(preset="gaudinic", extra={"HCCL_GAUDI_DIRECT": "0"})


def test_gaudi_direct_with_ofi_passes():
    assert env_for(preset="hostnic").as_dict()["HCCL_GAUDI_DIRECT"] == "1"
    env = env_for(report=EFA_NODE, extra={"HCCL_GAUDI_DIRECT": "1"})  # EFA with Gaudi Direct
    assert env.as_dict()["HCCL_OVER_OFI"] == "1"
    user = UserEnvFile("/root/.deepspeed_env", (("HCCL_OVER_OFI", "1"), ("HCCL_GAUDI_DIRECT", "1")))
    assert env_for(preset="gaudinic", user_files=[user]).as_dict()["HCCL_GAUDI_DIRECT"] == "1"


@pytest.mark.parametrize(
    ("route", "address", "expected"),
    [
        ('[{"dst":"10.0.0.9","gateway":"10.0.0.254","dev":"eth0","prefsrc":"10.0.0.1"}]', "10.0.0.9", "eth0"),
        # The master's own address routes through lo: the interface that holds it is the answer.
        ('[{"type":"local","dst":"10.0.0.1","dev":"lo","prefsrc":"10.0.0.1"}]', "10.0.0.1", "eth0"),
        ('[{"type":"local","dst":"127.0.0.1","dev":"lo"}]', "127.0.0.1", None),
        ("not json", "10.0.0.9", None),
        ("[]", "10.0.0.9", None),
    ],
)
def test_route_ifname(route, address, expected):
    assert presets.route_ifname(route, address, INTERFACES) == expected


@pytest.mark.parametrize(
    ("route_dev", "expected"),
    [
        ("eth0", "eth0"),
        ("hl0", None),  # a Gaudi NIC netdev: never HCCL's socket interface
        ("ib0", None),  # no IPv4 address
        ("lo", None),
        (None, None),
        ("eth9", None),  # not an interface of this node
    ],
)
def test_hccl_socket_ifname(route_dev, expected):
    assert presets.hccl_socket_ifname(route_dev, INTERFACES) == expected


def test_hpu_presets_write_hccl_socket_ifname_only_when_given():
    for name in ("efa", "gaudinic", "hostnic"):
        assert "HCCL_SOCKET_IFNAME" not in presets.PRESETS[name]({}, None)
        assert presets.PRESETS[name]({}, "eth0")["HCCL_SOCKET_IFNAME"] == "eth0"


@pytest.mark.parametrize(
    ("env", "provider"),
    [
        ({}, None),
        ({"HCCL_OVER_OFI": "1", "FI_EFA_USE_DEVICE_RDMA": "1"}, "efa"),
        ({"HCCL_OVER_OFI": "1", "HCCL_GAUDI_DIRECT": "1"}, "verbs"),
        ({"HCCL_OVER_OFI": "1", "HCCL_GAUDI_DIRECT": "1", "FI_PROVIDER": "tcp;ofi_rxm"}, "tcp"),
        ({"HCCL_OVER_OFI": "1"}, "efa"),
    ],
)
def test_wanted_provider(env, provider):
    assert presets.wanted_provider(env) == provider


def hpu_report(**over) -> dict:
    base = {
        "hostname": "node",
        "accelerator": "hpu",
        "slots": 8,
        "interfaces": [{"name": "eth0", "addresses": ["10.0.0.2"]}],
        "uverbs_devices": ["/dev/infiniband/uverbs0"],
        "hccl_ofi_wrapper": "/usr/lib/habanalabs/libhccl_ofi_wrapper.so",
        "profile": "gaudi",
        "driver_version": "1.22.1-97ec1a4",
        "fi_providers": {"efa": False, "verbs": True},
        "efa_provider": False,
    }
    base.update(over)
    return base


def findings(reports: dict, env: dict | None = None, ifname: str | None = None) -> list[Finding]:
    return check_nodes(
        as_reports(reports), {}, dict.fromkeys(reports), ifname, env or {}, (), min_free_disk=0
    )


def of(found: list[Finding], check: str) -> list[Finding]:
    return [f for f in found if f.check == check]


def test_a_driver_mismatch_blocks_naming_the_node_and_both_versions():
    found = findings({"w1": hpu_report(), "w2": hpu_report(driver_version="1.21.0-555")})
    (bad,) = [f for f in of(found, "driver") if not f.ok]
    assert bad.host == "w2" and bad.blocking
    assert bad.detail == (
        "host driver 1.21.0-555 on w2 (node) does not match the image's Synapse 1.22.0 (profile gaudi)"
    )
    assert "install the 1.22.x driver on w2" in bad.fix and "make image PROFILE=dl1" in bad.fix
    assert [f.host for f in blocking(found)] == ["w2"]


def test_the_driver_check_passes_within_the_release_and_is_skipped_without_a_profile():
    found = findings({"w1": hpu_report(driver_version="1.22.2-32"), "w2": hpu_report(profile=None)})
    assert [(f.host, f.ok) for f in of(found, "driver")] == [("w1", True)]
    (silent,) = of(findings({"w1": hpu_report(driver_version=None)}), "driver")
    assert not silent.ok and not silent.blocking and "hl-smi" in silent.detail


def test_hostnic_needs_the_verbs_provider():
    env = presets.PRESETS["hostnic"]({}, None)
    ok = of(findings({"w1": hpu_report()}, env), "ofi")
    assert [f.ok for f in ok] == [True] and "verbs provider" in ok[0].detail
    (bad,) = of(findings({"w1": hpu_report(fi_providers={"efa": False, "verbs": False})}, env), "ofi")
    assert not bad.ok and bad.detail == "`fi_info -p verbs` finds no verbs provider"


def test_efa_needs_the_efa_provider():
    env = presets.PRESETS["efa"]({}, None)
    (bad,) = of(findings({"w1": hpu_report()}, env), "efa")
    assert bad.detail == "`fi_info -p efa` finds no EFA provider"


def test_hccl_socket_ifname_is_never_a_gaudi_nic_and_exists_everywhere():
    gaudi_nic = hpu_report(interfaces=[{"name": "hl0", "addresses": ["192.168.1.2"], "driver": "habanalabs"}])
    (bad,) = of(findings({"w1": gaudi_nic}, {"HCCL_SOCKET_IFNAME": "hl0"}), "hccl interface")
    assert not bad.ok and "is a Gaudi NIC" in bad.detail
    (missing,) = of(findings({"w1": hpu_report()}, {"HCCL_SOCKET_IFNAME": "ens5"}), "hccl interface")
    assert not missing.ok and "ens5 missing" in missing.detail
    (fine,) = of(findings({"w1": hpu_report()}, {"HCCL_SOCKET_IFNAME": "eth0"}), "hccl interface")
    assert fine.ok
    # Checked once when it is also the socket interface of the interface row.
    assert (
        of(findings({"w1": hpu_report()}, {"HCCL_SOCKET_IFNAME": "eth0"}, ifname="eth0"), "hccl interface")
        == []
    )


def test_findings_are_json_ready():
    found = findings({"w1": hpu_report(driver_version="1.21.0-555")})
    assert json.loads(json.dumps([f.__dict__ for f in found]))
