"""The HPU scale-out rules: which preset `auto` picks, HCCL_SOCKET_IFNAME, Gaudi Direct without OFI,
and the doctor's driver, fabric and interface checks. Pure: probe reports and routes are given."""

from __future__ import annotations

import json

import pytest
from gaudi_cluster.env import presets
from gaudi_cluster.env.jobenv import UserEnvFile, choose_preset, describe, job_env
from gaudi_cluster.errors import ConfigError
from gaudi_cluster.nodes.checks import Finding, blocking, check_nodes
from gaudi_cluster.settings import profiles
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
        "driver_version": "1.24.1-b336d5e",
        "device_name": "HL-325L",
        "profile_paths": GAUDI_PATHS,
        "openmpi_version": "5.0.8",
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


def test_a_driver_mismatch_blocks_naming_the_node_both_versions_and_why():
    found = findings({"w1": hpu_report(), "w2": hpu_report(driver_version="1.22.1-97ec1a4")})
    (bad,) = [f for f in of(found, "driver") if not f.ok]
    assert bad.host == "w2" and bad.blocking
    assert bad.detail == (
        "host driver 1.22.1-97ec1a4 on w2 (node) does not match the image's Synapse 1.24.1 (profile gaudi): "
        "Habana supports a driver and a container of different releases on Gaudi 2 only (adjacent)"
    )
    # No profile runs a 1.22 driver on Gaudi 3: the driver is what to change.
    assert bad.fix == "install the 1.24.x driver on w2"
    assert [f.host for f in blocking(found)] == ["w2"]


def test_a_gaudi3_one_release_behind_is_told_the_profile_to_build():
    (bad,) = of(findings({"w1": hpu_report(driver_version="1.23.0-695")}), "driver")
    assert not bad.ok and "run the gaudi-1.23 profile's image (make image PROFILE=gaudi-1.23)" in bad.fix


def test_a_gaudi2_driver_one_release_away_is_a_supported_pair_two_are_not():
    (adjacent,) = of(
        findings({"w1": hpu_report(device_name="HL-225", driver_version="1.23.0-695")}), "driver"
    )
    assert adjacent.ok and "adjacent releases, supported on Gaudi 2" in adjacent.detail
    assert "HL-225 (Gaudi 2)" in adjacent.detail
    (far,) = of(findings({"w1": hpu_report(device_name="HL-225", driver_version="1.22.1-97ec1a4")}), "driver")
    assert not far.ok and "adjacent releases only" in far.detail


def test_a_first_generation_card_under_a_1_24_image_is_sent_to_the_dl1_profile():
    (bad,) = of(findings({"w1": hpu_report(device_name="HL-205", driver_version="1.21.0-555")}), "driver")
    assert not bad.ok and bad.blocking
    assert bad.detail == (
        "HL-205 (first-generation Gaudi) on w1 (node) is not supported by the image's Synapse 1.24.1 "
        "(profile gaudi: gaudi2, gaudi3)"
    )
    assert bad.fix == "run the dl1 profile's image (make image PROFILE=dl1)"
    dl1 = hpu_report(profile="dl1", device_name="HL-205", driver_version="1.21.1-12")
    (fine,) = of(findings({"w1": dl1}), "driver")
    assert (
        fine.ok
        and fine.detail
        == "host driver 1.21.1-12 on HL-205 (first-generation Gaudi), image dl1 Synapse 1.21.0"
    )


def test_the_driver_check_passes_within_the_release_and_is_skipped_without_a_profile():
    found = findings({"w1": hpu_report(driver_version="1.24.0-1007"), "w2": hpu_report(profile=None)})
    assert [(f.host, f.ok) for f in of(found, "driver")] == [("w1", True)]
    (silent,) = of(findings({"w1": hpu_report(driver_version=None)}), "driver")
    assert not silent.ok and not silent.blocking and "hl-smi" in silent.detail


GAUDI = profiles.load().profile("gaudi")
GAUDI_PATHS = dict.fromkeys(GAUDI.required_paths().values(), True)


def test_the_profiles_paths_are_checked_on_every_node_and_the_missing_one_named():
    (fine,) = of(findings({"w1": hpu_report()}), "paths")
    assert fine.ok and fine.detail == (
        f"Open MPI {GAUDI.openmpi.mpirun}, libfabric {GAUDI.libfabric.library} (Open MPI 5.0.8)"
    )
    missing = {**GAUDI_PATHS, GAUDI.openmpi.mpirun: False}
    (bad,) = of(findings({"w1": hpu_report(profile_paths=missing)}), "paths")
    assert not bad.ok and bad.blocking
    assert bad.detail == f"Open MPI {GAUDI.openmpi.mpirun} is missing (profile gaudi)"
    assert "make image PROFILE=gaudi" in bad.fix
    (old,) = of(findings({"w1": hpu_report(openmpi_version="4.1.6")}), "paths")
    assert not old.ok and "is Open MPI 4.1.6; profile gaudi launches with 5's flags" in old.detail


def test_nodes_of_two_profiles_are_named():
    found = findings({"w1": hpu_report(), "w2": hpu_report(), "w3": hpu_report(profile="gaudi-1.23")})
    (odd,) = of(found, "profile")
    assert odd.host == "w3" and odd.blocking and "gaudi-1.23 (others gaudi)" in odd.detail


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
