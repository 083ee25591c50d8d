#!/usr/bin/env bash
set -u
. /tmp/te/env.sh
cd /tmp/B
R="tests/test_rl_distributed.py::test_gpu_torchrun_cli_equals_one_process[bf16]"
P=tests/test_te_peer.py
run() { name=$1; shift; (timeout 300 python3 -m pytest -p no:xdist -p no:cacheprovider -q "$@" "$R" 2>&1 | tail -3 | sed "s/^/$name: /") & }
run gemm "$P::test_gpu_gemm_agreement"
run quant "$P::test_gpu_quantizers_bit_exact"
run e2e "$P::test_gpu_e2e_logprobs"
run update "$P::test_gpu_update_step"
run diag "$P::test_gpu_diagnose_te_learner_pairs"
(timeout 300 python3 -c "
import sys, pytest, transformer_engine.pytorch
sys.exit(pytest.main(['-p', 'no:xdist', '-p', 'no:cacheprovider', '-q', '$R']))" 2>&1 | tail -3 | sed "s/^/import: /") &
wait
