"""peers/te_cudnn.py: a Transformer Engine whose import would leave torch's cuDNN unusable is reported unavailable,
with the fix, before this process imports it (the import would silently move torch's attention off its cuDNN
kernel, changing every log-prob of our own profiles in the process)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

from minite_core.peers import te_cudnn, te_learner

MESSAGE = "cuDNN version incompatibility: PyTorch was compiled  against (9, 19, 0) but found runtime version (9, 14, 0)"


@pytest.fixture
def probe(monkeypatch):
    """conflict() with torch's cuDNN present and the subprocess answering `returncode` (and MESSAGE)."""
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    calls = []

    def answer(returncode):
        def run(cmd, **kw):
            calls.append(cmd)
            return subprocess.CompletedProcess(cmd, returncode, stdout=MESSAGE + "\n", stderr="")
        monkeypatch.setattr(te_cudnn.subprocess, "run", run)
        te_cudnn.conflict.cache_clear()
        return te_cudnn.conflict()
    yield answer, calls
    te_cudnn.conflict.cache_clear()


def test_a_conflict_names_both_versions_and_the_fix(probe):
    answer, calls = probe
    why = answer(te_cudnn.CONFLICT)
    assert MESSAGE in why and "CUDNN_HOME" in why and "LD_LIBRARY_PATH" in why and "\n" not in why
    assert calls[0][:2] == [sys.executable, "-c"] and "transformer_engine.pytorch" in calls[0][2]


@pytest.mark.parametrize("returncode", [0, 1])
def test_no_conflict_when_cudnn_survives_or_te_fails_to_import(probe, returncode):
    answer, _ = probe
    assert answer(returncode) is None  # 1: TE's own import error, which available() reports itself


def test_the_probe_runs_where_te_is_missing(monkeypatch):
    """The real subprocess: without TE its import fails (not a cuDNN conflict), so no reason is given here."""
    if importlib.util.find_spec("transformer_engine") is not None:
        pytest.skip("transformer_engine is installed here: the GPU test below covers this machine")
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    te_cudnn.conflict.cache_clear()
    try:
        assert te_cudnn.conflict() is None
    finally:
        te_cudnn.conflict.cache_clear()


def test_available_refuses_before_importing_te(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "transformer_engine" else None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(te_cudnn, "conflict", lambda: "importing Transformer Engine loads a cuDNN torch cannot use")
    before = {m for m in sys.modules if m.startswith("transformer_engine")}
    ok, why = te_learner.available()
    assert not ok and why.startswith("importing Transformer Engine loads a cuDNN")
    assert {m for m in sys.modules if m.startswith("transformer_engine")} == before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible)")
@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is None,
                    reason="transformer_engine is not installed (workflow/scripts/te_install_h200.sh)")
def test_gpu_installed_te_keeps_torch_cudnn():
    """TE as installed here (`. /tmp/te/env.sh`) can share a process with our profiles."""
    te_cudnn.conflict.cache_clear()
    assert te_cudnn.conflict() is None
