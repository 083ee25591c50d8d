"""`minite kernels` (the DAG's first stage): every check passes on this machine's backend, and a broken kernel
fails the stage with one line naming the kernel, the shape and the error."""
import json
import os

import pytest
import torch
import yaml

from minite_core.bench import kernel_check
from minite_core.cli import main as minite

triton = pytest.importorskip("triton")
# the smoke config checks the kernels on CPU, under Triton's interpreter, which must be on before triton is first
# imported: conftest turns it on only on a machine without a GPU (on the H200 this ran as a CPU check in a process
# whose triton compiles for CUDA, and failed on its first launch)
needs_interpreter = pytest.mark.skipif(torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                                reason="CPU kernel checks need TRITON_INTERPRET=1 from the start; GPU: `-m gpu`")


def _smoke_config() -> str:
    return json.dumps(yaml.safe_load(open("experiments/smoke.yaml")))


@needs_interpreter
def test_checks_pass_and_are_recorded(tmp_path, one_thread):
    out = tmp_path / "check.json"
    assert minite(["kernels", "--experiment-config", _smoke_config(), "--out", str(out), "--experiment", "t"]) == 0
    res = json.loads(out.read_text())
    assert res["schema"] == "kernels/v1" and res["metrics"]["failed"] == 0 and res["metrics"]["checks"] >= 15
    kinds = {r["kernel"].split("[")[0] for r in res["rows"]}
    assert {"quantize", "quantize_cols", "quantize_rows_cols", "gemm", "grouped_gemm", "kgrouped_gemm",
            "dequantize"} <= kinds
    assert all({"shape", "backend", "compile_s", "max_err", "verdict"} <= set(r) for r in res["rows"])


@needs_interpreter
def test_a_broken_kernel_stops_the_stage(tmp_path, monkeypatch, capsys, one_thread):
    from minite_core.kernels import grouped

    real = grouped.dequantize_triton
    monkeypatch.setattr(grouped, "dequantize_triton", lambda t, **kw: real(t, **kw) * 2)  # a planted bug
    out = tmp_path / "check.json"
    assert minite(["kernels", "--experiment-config", _smoke_config(), "--out", str(out), "--experiment", "t"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("minite kernels: error: kernel dequantize at ")
    assert json.loads(out.read_text())["metrics"]["failed"] >= 1


def test_profiles_come_from_the_config():
    cfg = yaml.safe_load(open("experiments/smoke.yaml"))
    names = kernel_check.experiment_profiles(cfg)
    assert {"bf16", "te-nvfp4", "vllm-nvfp4", "minite"} <= set(names)
