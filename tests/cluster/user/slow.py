"""A user's job that stays in training for SLOW_S seconds (default 20): a gloo barrier, then a loop."""

import os
import socket
import time
from datetime import timedelta

import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=120))
rank = dist.get_rank()
seconds = float(os.environ.get("SLOW_S", "20"))
started = time.monotonic()
while time.monotonic() - started < seconds:
    print(f"rank {rank} on {socket.gethostname()}: still training", flush=True)
    time.sleep(1)
dist.barrier()
print(f"rank {rank}: done", flush=True)
dist.destroy_process_group()
