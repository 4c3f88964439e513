"""A user's script that records what its start gave it, after the imports the zygote preloads on CPU
(torch, transformers, deepspeed, transformers' Trainer: variables those set at import are part of
what a rank sees):
environment, argv, working directory, sys.path, __name__, and whether its parent is the zygote."""

import json
import os
import socket
import sys

import deepspeed  # noqa: F401
import torch
import transformers
import transformers.trainer  # noqa: F401

with open(f"/proc/{os.getppid()}/cmdline", "rb") as handle:
    parent = handle.read().split(b"\0")
with open("/proc/self/cmdline", "rb") as handle:
    own_cmdline = handle.read().decode()
with open(
    os.path.join(os.environ.get("RESULT_DIR", "/workspace/shared"), f"view-{os.environ['RANK']}.json"), "w"
) as out:
    json.dump(
        {
            "env": dict(os.environ),
            "argv": sys.argv,
            "cwd": os.getcwd(),
            "path": sys.path,
            "name": __name__,
            "host": socket.gethostname(),
            "forked": b"gaudi_cluster.rank.zygote" in parent,
            "cmdline": own_cmdline,  # what ps shows of this rank
            "torch_seed": torch.initial_seed(),
        },
        out,
    )
