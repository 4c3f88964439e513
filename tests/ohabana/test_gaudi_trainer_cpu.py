"""The workload's Gaudi branches on CPU through the real stack of each image profile: optimum-habana's
GaudiTrainer (1.21.2, its final release, for the 1.24 default; 1.20.0 for gaudi-1.23; 1.18.1 for dl1),
and `--trainer native`, transformers' own Trainer with the same pinned transformers and accelerate and no
optimum-habana at all (the path left once optimum-habana, out of support since 2026-10-31, breaks).

No Gaudi here, so this is the part of the HPU path that can run: `GaudiTrainingArguments`, `GaudiTrainer`,
optimum-habana's `set_seed` and `GaudiConfig`, from a venv pinned exactly as the profile's Python stack
(scripts/make-ohabana-venv.sh, cached in build/ohabana-PROFILE; CPU torch stands in for Habana's). What
is faked, TEST-ONLY: a metadata-only habana-torch-plugin distribution (`import optimum.habana` reads its
version with `pip list`) and tests/ohabana/stubs/habana_frameworks (HPU memory statistics for the log,
the HPU seed). The run is the seed's: a local gaudi_config.json in place of --gaudi_config_name
Habana/gpt2, --throughput_warmup_steps 3, --gradient_checkpointing; one process, then two ranks.
--deepspeed cannot be exercised: optimum-habana refuses it off HPU, whatever DeepSpeed is installed.
What only an HPU shows (the device, HCCL, eager against lazy mode) is not exercised by either branch here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from gaudi_cluster.settings import profiles

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
STUBS = Path(__file__).resolve().parent / "stubs"
# The Hub's Habana/gpt2 GaudiConfig: the fused ops are HPU-only, optimum-habana skips them off HPU.
GAUDI_CONFIG = {"use_fused_adam": True, "use_fused_clip_norm": True, "use_torch_autocast": False}
STEPS = 4


PROFILES = sorted(profiles.load().profiles)
Build = tuple[subprocess.Popen, Path]  # the build script's process and its log


@pytest.fixture(scope="session")
def venv_builds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Build]]:
    """Every profile's venv built (or found up to date) by scripts/make-ohabana-venv.sh, all at once.

    Built one after the other, each when its profile's tests came, they took about 200 s of the serial
    stage on a fresh clone. The script queues the wheel fetches into the shared wheelhouse on its lock;
    the installs (single processes, much of it disk) overlap: 303 s in a row against 260 s side by side,
    wheels cached, measured on a 2-core machine others were loading.
    """
    logs = tmp_path_factory.mktemp("ohabana-venvs")
    builds: dict[str, Build] = {}
    for name in PROFILES:
        log = logs / f"{name}.log"
        with log.open("w") as out:
            builds[name] = (
                subprocess.Popen(
                    [str(ROOT / "scripts" / "make-ohabana-venv.sh"), name],
                    env={**os.environ, "PYTHON": sys.executable},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    text=True,
                ),
                log,
            )
    yield builds
    for proc, _ in builds.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module", params=PROFILES)
def venv(request, venv_builds) -> tuple[str, Path]:
    """(profile, venv): this profile's build, waited for."""
    proc, log = venv_builds[request.param]
    code = proc.wait(timeout=1500)
    assert code == 0, log.read_text()[-3000:]
    return request.param, ROOT / "build" / f"ohabana-{request.param}"


# Runs the workload in-process and then says whether optimum-habana was ever imported.
IMPORT_WATCH = (
    "import runpy, sys\n"
    "sys.argv = ['run_clm', *sys.argv[1:]]\n"
    "try:\n"
    "    runpy.run_module('train.run_clm', run_name='__main__')\n"
    "finally:\n"
    "    print('optimum.habana imported:', 'optimum.habana' in sys.modules, flush=True)\n"
)


def run_workload(
    venv: Path, tmp: Path, *extra: str, ranks: int = 1, watch_imports: bool = False
) -> subprocess.CompletedProcess[str]:
    (tmp / "gaudi_config.json").write_text(json.dumps(GAUDI_CONFIG))
    env = {
        **os.environ,
        # optimum-habana runs the `pip` of PATH to find habana-torch-plugin.
        "PATH": f"{venv / 'bin'}:{os.environ['PATH']}",
        "PYTHONPATH": f"{ROOT / 'app'}:{STUBS}",
        "GAUDI_CLUSTER_GAUDI_STACK_ON_CPU": "1",
        # A habana_frameworks is importable, so stock DeepSpeed would pick its HPU accelerator.
        "DS_ACCELERATOR": "cpu",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
    }
    launcher = [str(venv / "bin" / "python")]
    if ranks > 1:
        launcher = [str(venv / "bin" / "torchrun"), "--standalone", "--nproc_per_node", str(ranks)]
    argv = [
        *launcher,
        *(["-c", IMPORT_WATCH] if watch_imports else ["-m", "train.run_clm"]),
        "--do_train",
        "--output_dir",
        str(tmp / "out"),
        "--max_steps",
        str(STEPS),
        "--per_device_train_batch_size",
        "2",
        "--block_size",
        "64",
        "--logging_steps",
        "1",
        "--throughput_warmup_steps",
        "3",
        "--gradient_checkpointing",
        "--gaudi_config_name",
        str(tmp / "gaudi_config.json"),
        "--save_strategy",
        "no",
        "--plot",
        "false",
        *extra,
    ]
    return subprocess.run(argv, env=env, cwd=tmp, capture_output=True, text=True, timeout=600, check=False)


def events(stdout: str) -> dict[str, dict]:
    prefix = "gaudi-cluster-event "
    found = [json.loads(line[len(prefix) :]) for line in stdout.splitlines() if line.startswith(prefix)]
    return {event["event"]: event for event in found}


def test_the_venv_is_the_profiles_stack(venv):
    name, path = venv
    profile = profiles.load().profile(name)
    probe = (
        "import importlib.metadata as m, json; names = ('optimum-habana', 'transformers', "
        "'habana-torch-plugin'); print(json.dumps({n: m.version(n) for n in names} "
        "| {'requires': m.requires('optimum-habana')}))"
    )
    done = subprocess.run(
        [str(path / "bin" / "python"), "-c", probe], capture_output=True, text=True, check=True
    )
    found = json.loads(done.stdout)
    assert found["optimum-habana"] == profile.get("optimum_habana.version")
    assert found["transformers"] == profile.get("python_pins.transformers")
    assert found["habana-torch-plugin"] == profile.get("habana_torch_plugin")
    # The range recorded in profiles.json is the one the real wheel declares.
    declared = next(r for r in found["requires"] if r.replace(" ", "").startswith("transformers"))
    assert set(declared.replace(" ", "").removeprefix("transformers").split(",")) == set(
        profile.get("optimum_habana.requires.transformers").split(",")
    )


def test_gaudi_trainer_trains_on_cpu_with_a_local_gaudi_config(venv, tmp_path):
    _, path = venv
    done = run_workload(path, tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    seen = events(done.stdout)
    assert seen["train_done"]["step"] == STEPS and seen["model_ready"]["world_size"] == 1
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    # GaudiTrainer.log adds the HPU memory statistics to every log entry: the Gaudi trainer ran.
    assert all("memory_allocated (GB)" in entry for entry in state["log_history"])
    assert [entry["step"] for entry in state["log_history"] if "loss" in entry] == list(range(1, STEPS + 1))
    # GaudiTrainer saves the GaudiConfig it was given next to the model: the local file's.
    saved = json.loads((tmp_path / "out" / "gaudi_config.json").read_text())
    assert {key: saved[key] for key in GAUDI_CONFIG} == GAUDI_CONFIG
    metrics = json.loads((tmp_path / "out" / "train_results.json").read_text())
    assert metrics["throughput_warmup_steps_applied"] == 3


def test_gaudi_trainer_on_two_ranks(venv, tmp_path):
    _, path = venv
    done = run_workload(path, tmp_path, ranks=2)
    assert done.returncode == 0, done.stderr[-4000:]
    seen = events(done.stdout)
    assert seen["model_ready"]["world_size"] == 2 and seen["train_done"]["step"] == STEPS
    metrics = json.loads((tmp_path / "out" / "train_results.json").read_text())
    assert metrics["world_size"] == 2 and metrics["global_batch_size"] == 4


def test_deepspeed_is_refused_off_hpu_with_one_line(venv, tmp_path):
    _, path = venv
    done = run_workload(path, tmp_path, "--deepspeed", "ds_cpu")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "run_clm: error: This version of DeepSpeed must be run on HPUs." in done.stderr
    assert "Traceback" not in done.stderr


def test_the_native_trainer_trains_with_the_profiles_transformers_and_no_optimum_habana(venv, tmp_path):
    _, path = venv
    done = run_workload(path, tmp_path, "--trainer", "native", watch_imports=True)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "optimum.habana imported: False" in done.stdout
    seen = events(done.stdout)
    assert seen["train_done"]["step"] == STEPS and seen["model_ready"]["world_size"] == 1
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    assert [entry["step"] for entry in state["log_history"] if "loss" in entry] == list(range(1, STEPS + 1))
    # transformers' own Trainer: no HPU memory figures in the logs, no GaudiConfig saved with the model.
    assert not any("memory_allocated (GB)" in entry for entry in state["log_history"])
    assert not (tmp_path / "out" / "gaudi_config.json").exists()
    assert (
        "--trainer native on cpu: --gaudi_config_name accepted and ignored (GaudiTrainer only)" in done.stderr
    )
    metrics = json.loads((tmp_path / "out" / "train_results.json").read_text())
    assert metrics["throughput_warmup_steps_applied"] == 3


def test_an_unknown_trainer_is_refused_with_one_line(venv, tmp_path):
    _, path = venv
    done = run_workload(path, tmp_path, "--trainer", "fast")
    assert done.returncode == 2 and "--trainer fast: use one of gaudi, native" in done.stderr
