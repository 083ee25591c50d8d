"""`minite doctor` on CPU: packages, GPU, the backend `auto` picks and why, every profile's execution."""
from __future__ import annotations

from minite_core import doctor
from minite_core.cli import main as cli_main
from minite_core.profiles import PROFILES


def test_doctor_screen_on_cpu(capsys):
    assert cli_main(["doctor"]) == 0
    out = capsys.readouterr().out
    import torch

    assert f"torch                {torch.__version__}" in out
    assert "GPU: none" in out and "backend (`auto`" in out and ": reference" in out
    assert "native     native NVFP4 GEMM needs a CUDA GPU" in out  # why the native backend is not usable
    for name in PROFILES:
        assert f"  {name} " in out
    assert "reference (plain torch: exact NVFP4 codes, fp32 GEMM)" in out
    assert "Packed decode GEMM (`-packed` profiles, <= 16 rows): the reference (no CUDA GPU)" in out


def test_missing_package_gets_its_install_line(monkeypatch):
    real = doctor._version
    monkeypatch.setattr(doctor, "_version", lambda d: None if d == "snakemake" else real(d))
    out = doctor.report()
    assert "snakemake            missing" in out and '-> pip install -e ".[workflow]"' in out


def test_profile_execution_by_backend():
    minite, bf16, marlin = PROFILES["minite"], PROFILES["bf16"], PROFILES["vllm-marlin-w4a16"]
    assert doctor.profile_execution(minite, "native", "sm_100") == "native NVFP4 (FP4 tensor cores)"
    assert doctor.profile_execution(minite, "triton", "sm_90").startswith("W4A4 exact on bf16 tensor cores")
    assert doctor.profile_execution(marlin, "native", "sm_100").startswith("W4A16 exact on bf16 tensor cores")
    assert doctor.profile_execution(bf16, "triton", "sm_90") == "native bf16"
    assert doctor.profile_execution(minite, "reference", None).startswith("reference")
