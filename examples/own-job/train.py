"""A job of your own, as gaudi-cluster runs it: every rank reads the data set from its mount, the ranks
sum what they read with one all-reduce a step, and rank 0 writes the result to the output volume.

    GAUDI_CLUSTER_CODE=$PWD/examples/own-job scripts/run-node.sh master /workspace/code/train.py DATA [STEPS]

It uses only torch (gloo on CPU, hccl where Habana's torch is installed) and the variables every rank
gets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). It never prints a secret: only whether HF_TOKEN is
set, as a Hugging Face download would use it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def backend() -> str:
    try:
        import habana_frameworks.torch.distributed.hccl  # noqa: F401  (registers "hccl")
    except ImportError:
        return "gloo"
    return "hccl"


def main() -> None:
    data = Path(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    rank = int(os.environ["RANK"])
    dist.init_process_group(backend())
    lines = len(data.read_text(encoding="utf-8").splitlines())
    total = torch.tensor([float(lines)])
    for step in range(1, steps + 1):
        total = torch.tensor([float(lines)])
        dist.all_reduce(total)
        time.sleep(0.5)  # stands in for a training step's work
        if rank == 0:
            world = dist.get_world_size()
            print(f"step {step}/{steps}: {int(total.item())} lines over {world} ranks", flush=True)
    if rank == 0:
        hf_home = os.environ.get("HF_HOME", "")
        print(f"HF_TOKEN {'set' if os.environ.get('HF_TOKEN') else 'not set'}; HF_HOME={hf_home or '-'}")
        if hf_home:  # the Hugging Face cache is a mount of its own: it outlives the container
            Path(hf_home, "own-job-was-here").write_text("cached\n", encoding="utf-8")
        result = {"lines": int(total.item()), "world_size": dist.get_world_size(), "steps": steps}
        Path("/workspace/output/own-job-result.json").write_text(json.dumps(result) + "\n", encoding="utf-8")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
