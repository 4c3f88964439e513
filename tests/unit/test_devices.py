from __future__ import annotations

import sys

import pytest
from gaudi_cluster.errors import ConfigError
from gaudi_cluster.nodes.devices import (
    HL_SMI_INDEX,
    NVIDIA_SMI_LIST,
    cuda_visible_count,
    default_run,
    detect_accelerator,
    detect_slots,
)

GAUDI_DEV = ["accel0", "accel1", "accel_controlD0", "accel_controlD1", "accel2", "accel3"]


def drivers(bound):
    """A sysfs whose class/accel/accelN (and class/net/X) devices are bound as given."""

    def driver_of(device):
        return bound.get(device.rsplit("/", 1)[-1])

    return driver_of


# Every accel node of GAUDI_DEV is a Gaudi card.
HABANA = drivers({f"accel{i}": "habanalabs" for i in range(8)})


def lister(entries):
    def list_dir(path):
        if entries is None or path != "/dev/accel":
            raise FileNotFoundError(path)
        return list(entries)

    return list_dir


def runner(outputs):
    def run(argv):
        return outputs.get(tuple(argv))

    return run


NO_TOOLS = runner({})


@pytest.mark.parametrize(
    ("accel", "env", "dev", "outputs", "expected"),
    [
        pytest.param("hpu", {}, GAUDI_DEV, {}, 4, id="hpu-dev-nodes-skip-control"),
        pytest.param(
            "hpu", {}, None, {HL_SMI_INDEX: "0\n1\n2\n3\n4\n5\n6\n7\n"}, 8, id="hpu-hl-smi-fallback"
        ),
        pytest.param("hpu", {}, [], {HL_SMI_INDEX: "0\n1\n"}, 2, id="hpu-empty-dir-falls-back"),
        pytest.param("hpu", {}, None, {}, 0, id="hpu-nothing"),
        pytest.param("hpu", {"HABANA_VISIBLE_MODULES": "0,1"}, GAUDI_DEV, {}, 2, id="hpu-visible-modules"),
        pytest.param("hpu", {"HABANA_VISIBLE_MODULES": " 4, 5 ,6 "}, None, {}, 3, id="hpu-visible-spaces"),
        pytest.param(
            "hpu", {"HABANA_VISIBLE_MODULES": ""}, GAUDI_DEV, {}, 4, id="hpu-visible-empty-is-unset"
        ),
        pytest.param(
            "cuda", {}, None, {NVIDIA_SMI_LIST: "GPU 0: A (UUID: x)\nGPU 1: A (UUID: y)\n"}, 2, id="cuda-smi"
        ),
        pytest.param("cuda", {}, None, {}, 0, id="cuda-no-smi"),
        pytest.param("cuda", {"CUDA_VISIBLE_DEVICES": "0,1,2"}, None, {}, 3, id="cuda-visible"),
        pytest.param(
            "cuda", {"CUDA_VISIBLE_DEVICES": ""}, None, {NVIDIA_SMI_LIST: "GPU 0: A\n"}, 0, id="cuda-empty"
        ),
        pytest.param("cuda", {"CUDA_VISIBLE_DEVICES": "-1"}, None, {}, 0, id="cuda-minus-one"),
        pytest.param("cuda", {"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, None, {}, 0, id="cuda-nodevfiles"),
        pytest.param("cpu", {}, GAUDI_DEV, {}, 1, id="cpu-default"),
    ],
)
def test_detect_slots(accel, env, dev, outputs, expected):
    assert detect_slots(accel, env, list_dir=lister(dev), run=runner(outputs), driver_of=HABANA) == expected


def test_cpu_slots_given():
    assert detect_slots("cpu", {}, cpu_slots=3, list_dir=lister(None), run=NO_TOOLS) == 3


@pytest.mark.parametrize(
    ("value", "expected"),
    [("0,-1,2", 1), ("GPU-abc,GPU-def", 2), ("1", 1), (" ", 0), ("0,,1", 1)],
)
def test_cuda_visible_count(value, expected):
    assert cuda_visible_count(value) == expected


@pytest.mark.parametrize(
    ("accel", "env", "kwargs", "match"),
    [
        pytest.param(
            "hpu", {"HABANA_VISIBLE_MODULES": "0,a"}, {}, "HABANA_VISIBLE_MODULES='0,a'", id="bad-module"
        ),
        pytest.param("hpu", {"HABANA_VISIBLE_MODULES": "1,1"}, {}, "twice", id="dup-module"),
        pytest.param("cpu", {}, {"cpu_slots": 0}, "GAUDI_CLUSTER_SLOTS=0", id="cpu-zero"),
        pytest.param("xpu", {}, {}, "'xpu' is unknown", id="unknown"),
    ],
)
def test_detect_slots_errors(accel, env, kwargs, match):
    with pytest.raises(ConfigError, match=match) as exc:
        detect_slots(accel, env, list_dir=lister(None), run=NO_TOOLS, **kwargs)
    assert "fix:" in str(exc.value)


@pytest.mark.parametrize(
    ("env", "dev", "outputs", "expected"),
    [
        pytest.param({}, GAUDI_DEV, {}, "hpu", id="dev-accel-habanalabs"),
        pytest.param({}, None, {HL_SMI_INDEX: "0\n"}, "hpu", id="hl-smi"),
        pytest.param({}, ["accel_controlD0"], {}, "cpu", id="control-node-only"),
        pytest.param({}, None, {NVIDIA_SMI_LIST: "GPU 0: H200 (UUID: x)\n"}, "cuda", id="nvidia-smi"),
        pytest.param({}, None, {NVIDIA_SMI_LIST: "No devices found\n"}, "cpu", id="nvidia-smi-none"),
        pytest.param({}, None, {}, "cpu", id="nothing"),
        pytest.param({"DS_ACCELERATOR": "cpu"}, GAUDI_DEV, {}, "cpu", id="ds-override"),
        pytest.param(
            {"GAUDI_CLUSTER_ACCELERATOR": "CUDA", "DS_ACCELERATOR": "cpu"}, None, {}, "cuda", id="gc-wins"
        ),
        pytest.param(
            {"GAUDI_CLUSTER_ACCELERATOR": "auto", "DS_ACCELERATOR": "hpu"}, None, {}, "hpu", id="auto-defers"
        ),
    ],
)
def test_detect_accelerator(env, dev, outputs, expected):
    assert detect_accelerator(env, list_dir=lister(dev), run=runner(outputs), driver_of=HABANA) == expected


def test_detect_accelerator_rejects_unsupported():
    with pytest.raises(ConfigError, match=r"DS_ACCELERATOR='xpu'.*fix:"):
        detect_accelerator({"DS_ACCELERATOR": "xpu"}, list_dir=lister(None), run=NO_TOOLS)


def test_default_run():
    assert default_run([sys.executable, "-c", "print('ok')"]) == "ok\n"
    assert default_run([sys.executable, "-c", "raise SystemExit(3)"]) is None
    assert default_run(["/nonexistent/hl-smi"]) is None
