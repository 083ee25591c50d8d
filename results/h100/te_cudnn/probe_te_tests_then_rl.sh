#!/usr/bin/env bash
# which process state changes the in-process learner's bits in test_gpu_torchrun_cli_equals_one_process
set -u
. /tmp/te/env.sh
cd /tmp/B
T="tests/test_rl_distributed.py::test_gpu_torchrun_cli_equals_one_process"
echo "== 1: the TE gpu tests, then the RL test, one process"
timeout 240 python3 -m pytest -p no:xdist -p no:cacheprovider -q -m gpu tests/test_te_peer.py "$T" 2>&1 | tail -8
echo "== 2: the RL test alone under a GPU load"
python3 -c "
import torch, time
a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)
t = time.time()
while time.time() - t < 100:
    a @ a
torch.cuda.synchronize()" &
timeout 150 python3 -m pytest -p no:xdist -p no:cacheprovider -q "$T" 2>&1 | tail -8
wait
