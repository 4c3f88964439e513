"""A user's job that stays in training for SLOW_S seconds (default 20), or until the file STOP_FILE
exists (a test ends it when it has seen what it came for, instead of waiting out a fixed time): a gloo
barrier, then a loop."""

import os
import socket
import time
from datetime import timedelta

import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=120))
rank = dist.get_rank()
seconds = float(os.environ.get("SLOW_S", "20"))
stop_file = os.environ.get("STOP_FILE", "")
started = time.monotonic()
while time.monotonic() - started < seconds and not (stop_file and os.path.exists(stop_file)):
    print(f"rank {rank} on {socket.gethostname()}: still training", flush=True)
    time.sleep(1)
dist.barrier()
print(f"rank {rank}: done", flush=True)
dist.destroy_process_group()
