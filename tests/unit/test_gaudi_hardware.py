"""Gaudi detection against recorded tool outputs and a fake sysfs tree: which /dev/accel nodes are Gaudi
cards, the host driver version from hl-smi, libfabric providers from fi_info, and what the probe reports.

Tool outputs follow Habana's hl-smi documentation (`-Q ... -f csv,noheader`: one row per card) and
libfabric's fi_info (short format `provider: NAME` blocks; no match: `fi_getinfo: -61`, exit 61). The
stand-ins in tests/cluster/hpu are the same ones the HPU-shaped cluster test bakes into its image.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from gaudi_cluster.env import presets
from gaudi_cluster.nodes import devices, probe
from gaudi_cluster.settings import profiles
from gaudi_cluster.wire.node_report import NodeReport

HPU_DIR = Path(__file__).resolve().parents[1] / "cluster" / "hpu"

# `hl-smi -Q driver_version -f csv,noheader` on an 8-card Gaudi 2 server.
HL_SMI_DRIVER = "1.22.1-97ec1a4\n" * 8
# `fi_info -p efa` on a DL1 node (short format, one block per endpoint type).
FI_INFO_EFA = """provider: efa
    fabric: efa
    domain: rdmap16s27-rdm
    version: 122.0
    type: FI_EP_RDM
    protocol: FI_PROTO_EFA
provider: efa
    fabric: efa
    domain: rdmap16s27-dgrm
    version: 122.0
    type: FI_EP_DGRAM
    protocol: FI_PROTO_EFA
"""
FI_INFO_VERBS_RXM = "provider: verbs;ofi_rxm\n    fabric: IB-0xfe80000000000000\n    domain: mlx5_0\n"


@pytest.fixture
def sysfs(tmp_path) -> Path:
    root = tmp_path / "sys"
    subprocess.run(["bash", str(HPU_DIR / "make-fake-sysfs.sh"), str(root)], check=True)
    return root


def lister(names):
    def list_dir(path):
        assert path == "/dev/accel"
        return list(names)

    return list_dir


def no_tools(argv):
    return None


@pytest.mark.parametrize(
    ("dev", "slots", "kind"),
    [
        pytest.param([f"accel{i}" for i in range(8)], 8, "hpu", id="all-eight"),
        # HABANA_VISIBLE_DEVICES=2,3: the runtime mounts accel2, accel3 and their control nodes, no accel0.
        pytest.param(["accel2", "accel3", "accel_controlD2", "accel_controlD3"], 2, "hpu", id="visible-2-3"),
        # An Intel NPU also lives in /dev/accel: accel8 is bound to intel_vpu, not a Gaudi.
        pytest.param(["accel8"], 0, "cpu", id="npu-only"),
        pytest.param(["accel0", "accel8"], 1, "hpu", id="one-gaudi-and-an-npu"),
        # A node listed in /dev that sysfs does not show as a device counts as nothing.
        pytest.param(["accel9"], 0, "cpu", id="unknown-node"),
    ],
)
def test_gaudi_cards_are_accel_nodes_bound_to_habanalabs(sysfs, dev, slots, kind):
    env = {devices.SYSFS_ROOT_ENV: str(sysfs)}
    assert devices.detect_slots("hpu", env, list_dir=lister(dev), run=no_tools) == slots
    assert devices.detect_accelerator(env, list_dir=lister(dev), run=no_tools) == kind


def test_sysfs_driver_reads_the_bound_driver(sysfs):
    driver_of = devices.sysfs_driver(str(sysfs))
    assert driver_of("class/accel/accel0") == "habanalabs"
    assert driver_of("class/accel/accel8") == "intel_vpu"
    assert driver_of("class/net/hl0") == "habanalabs"
    assert driver_of("class/net/eth0") is None
    assert devices.sysfs_root({}) == "/sys"


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (HL_SMI_DRIVER, "1.22.1-97ec1a4"),
        ("1.21.0-555\n", "1.21.0-555"),
        ("", None),
        (None, None),
        ("hl-smi: no devices\n", None),
    ],
)
def test_driver_version_from_hl_smi(output, expected):
    def run(argv):
        assert tuple(argv) == devices.HL_SMI_DRIVER_VERSION
        return output

    assert devices.driver_version(run) == expected


@pytest.mark.parametrize(
    ("stdout", "provider", "found"),
    [
        (FI_INFO_EFA, "efa", True),
        (FI_INFO_EFA, "verbs", False),
        (FI_INFO_VERBS_RXM, "verbs", True),
        ("", "efa", False),
    ],
)
def test_fi_info_provider_lines(stdout, provider, found):
    assert devices.fi_info_has_provider(stdout, provider) is found


@pytest.fixture
def fake_node(tmp_path, sysfs, monkeypatch) -> Path:
    """This process as an HPU node: the test stand-ins for hl-smi, fi_info and mpirun, the fake sysfs,
    and the dl1 profile with its paths moved into tmp_path."""
    fake = tmp_path / "fake-habana"
    fake.mkdir()
    (fake / "driver_version").write_text("1.21.0-555\n")
    (fake / "device_name").write_text("HL-205\n")
    (fake / "providers").write_text("verbs\n")
    libfabric = tmp_path / "libfabric"
    (libfabric / "bin").mkdir(parents=True)
    (libfabric / "lib").mkdir()
    (libfabric / "lib" / "libfabric.so.1").write_text("")
    (libfabric / "bin" / "fi_info").symlink_to(HPU_DIR / "fi_info")
    openmpi = tmp_path / "openmpi"
    (openmpi / "bin").mkdir(parents=True)
    (openmpi / "share").mkdir()
    (openmpi / "share" / "fake-openmpi-version").write_text("4.1.6\n")
    (openmpi / "bin" / "mpirun").symlink_to(HPU_DIR / "mpirun")
    raw = json.loads(profiles.MATRIX_PATH.read_text())
    dl1 = raw["profiles"]["dl1"]
    dl1["openmpi"]["root"] = str(openmpi)
    dl1["libfabric"]["root"] = dl1["efa"]["root"] = str(libfabric)
    monkeypatch.setattr(probe, "node_profile", profiles.load(json.dumps(raw)).profiles.get)
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "hl-smi").symlink_to(HPU_DIR / "hl-smi")
    monkeypatch.setenv("FAKE_HABANA_DIR", str(fake))
    monkeypatch.setenv("LIBFABRIC_ROOT", str(libfabric))
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/lib/habanalabs")
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    monkeypatch.setenv(devices.SYSFS_ROOT_ENV, str(sysfs))
    return libfabric


def test_fi_info_runs_with_the_ranks_ld_library_path(fake_node):
    environ = dict(os.environ)
    # The stand-in finds a provider only when this libfabric's lib comes first, as for the ranks.
    assert presets.fabric_ld_library_path(environ).startswith(f"{fake_node}/lib:")
    assert probe.fi_providers(["efa", "verbs"], environ) == {"efa": False, "verbs": True}
    assert probe.fi_providers(["verbs"], {**environ, "LIBFABRIC_ROOT": "/elsewhere", "PATH": "/nothing"}) == {
        "verbs": None
    }


def test_probe_of_an_hpu_node_reports_driver_profile_and_providers(fake_node, monkeypatch, tmp_path):
    profile_file = tmp_path / "PROFILE"
    profile_file.write_text("dl1\n")
    monkeypatch.setattr(probe, "PROFILE_FILE", profile_file)
    report = probe.probe([], "hpu", None, check_efa=False, check_fabric=True)
    assert report.driver_version == "1.21.0-555"
    assert report.profile == "dl1" and report.device_name == "HL-205"
    assert report.openmpi_version == "4.1.6"
    assert report.profile_paths == {
        f"{tmp_path}/openmpi/bin/mpirun": True,
        f"{fake_node}/lib/libfabric.so.1": True,
        f"{fake_node}/lib": True,
    }
    assert report.fi_providers == {"efa": False, "verbs": True}
    assert report.efa_provider is False
    # No /dev/accel on this machine: the slots fall back to hl-smi's 8 cards.
    assert report.slots == 8
    # What the master reads back over ssh is what the node measured.
    assert NodeReport.from_json(report.to_json()) == report


def test_probe_of_a_cpu_node_runs_no_vendor_tool(fake_node):
    report = probe.probe([], "cpu", None, check_efa=False, check_fabric=True)
    assert report.driver_version is None and report.fi_providers == {}
