"""Bad input never passes silently: one-line CLI errors naming the input, non-finite data stops a stage, empty
inputs are errors, one writer per run directory, checked resume, atomic writes, the NVFP4 API contract.
(Bad experiment configs: tests/test_workflow.py, at DAG parse time.)"""
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from minite_core.formats.nvfp4 import FLT_MAX, dequantize, quantize
from minite_core.model import PRESETS, CausalLM, load_pretrained, save_pretrained
from minite_core.results import atomic_write_bytes
from minite_core.runs.lock import RunLock, RunLocked
from minite_core.runs.state import DamagedState, resume, save_state
from minite_core.task.jsonl import read_jsonl

ROOT = Path(__file__).resolve().parents[1]


def _minite(*args, env=None):
    return subprocess.run([sys.executable, "-m", "minite_core.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


def _tiny(tmp_path, name="ckpt", poison=False) -> Path:
    model = CausalLM(PRESETS["tiny-moe"]).init_weights(0)
    if poison:
        with torch.no_grad():
            model.model.layers[0].self_attn.q_proj.weight[0, 0] = float("nan")
    return save_pretrained(model, tmp_path / name)


# ---- CLI: one line, non-zero exit, traceback only with --debug --------------------------------------------------
def test_cli_error_is_one_line_naming_the_input(tmp_path):
    missing = tmp_path / "nope"
    res = _minite("diagnose", "--checkpoint", str(missing), "--out", str(tmp_path / "o.json"))
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minite diagnose: error: ") and str(missing) in lines[0]
    assert "Traceback" not in res.stderr


def test_debug_shows_the_traceback(tmp_path):
    missing = str(tmp_path / "nope")
    for res in (_minite("diagnose", "--checkpoint", missing, "--out", "x.json", "--debug"),
                _minite("diagnose", "--checkpoint", missing, "--out", "x.json", env={"MINITE_DEBUG": "1"})):
        assert res.returncode != 0 and "Traceback" in res.stderr


def test_unknown_command_and_bad_flag_values():
    res = _minite("nope")
    assert res.returncode == 2 and "minite: error: unknown command 'nope'" in res.stderr
    res = _minite("quant-error", "--out", "x.json", "--cols", "24")
    assert res.returncode == 2 and "--cols" in res.stderr and "multiple of 16" in res.stderr
    res = _minite("quant-error", "--out", "x.json", "--config-json", '{"colz": 32}')
    assert res.returncode == 2 and "unknown key 'colz'" in res.stderr
    res = _minite("quant-error", "--out", "x.json", "--device", "cuda")
    if not torch.cuda.is_available():
        assert res.returncode == 2 and "no CUDA GPU" in res.stderr


def test_num_prompts_zero_is_an_error(tmp_path):
    ckpt = _tiny(tmp_path)
    res = _minite("diagnose", "--checkpoint", str(ckpt), "--num-prompts", "0", "--out", str(tmp_path / "o.json"))
    assert res.returncode == 2 and "--num-prompts" in res.stderr
    assert not (tmp_path / "o.json").exists()


# ---- non-finite weights, damaged checkpoints ---------------------------------------------------------------------
def test_nan_weights_stop_the_stage_naming_the_tensor(tmp_path):
    ckpt = _tiny(tmp_path, poison=True)
    with pytest.raises(ValueError, match=r"non-finite.*q_proj\.weight"):
        load_pretrained(ckpt)
    res = _minite("diagnose", "--checkpoint", str(ckpt), "--pairs", "bf16:bf16", "--num-prompts", "2",
                  "--max-new-tokens", "2", "--out", str(tmp_path / "o.json"))
    assert res.returncode == 1 and "q_proj.weight" in res.stderr and not (tmp_path / "o.json").exists()


def test_truncated_safetensors_names_the_file(tmp_path):
    ckpt = _tiny(tmp_path)
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError, match=str(weights)):
        load_pretrained(ckpt)


def test_not_a_checkpoint_dir_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_pretrained(tmp_path)


# ---- empty inputs ------------------------------------------------------------------------------------------------
def test_empty_and_malformed_jsonl(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="no rows"):
        read_jsonl(empty)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1=\\n"}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not a JSON line"):
        read_jsonl(bad)
    with pytest.raises(ValueError, match=r"bad.jsonl:1: missing field"):
        read_jsonl(tmp_path / "bad.jsonl", fields=("prompt", "response"))
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_empty_batches_are_errors():
    from minite_core.engines import Sampler, pack_right

    model = CausalLM(PRESETS["tiny-moe"]).init_weights(0)
    with pytest.raises(ValueError, match="no prompts"):
        Sampler(model, "bf16").generate([], max_new_tokens=2, seed=0)
    with pytest.raises(ValueError, match="no prompts"):
        pack_right([], [])


# ---- run directory: lock, checked resume, atomic writes ------------------------------------------------------
def test_second_writer_fails_at_once_naming_the_holder(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from minite_core.runs.lock import RunLock\n"
        f"with RunLock({str(tmp_path)!r}):\n    print('held', flush=True); time.sleep(60)")],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.perf_counter()
        with pytest.raises(RunLocked, match=rf"in use by another run .*\"pid\": {holder.pid}"):
            with RunLock(tmp_path):
                pass
        assert time.perf_counter() - t0 < 5
    finally:
        holder.kill()
        holder.wait()
    with RunLock(tmp_path):  # released when the holder died, even by SIGKILL
        pass


def _state(tmp_path, steps=3):
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    cfg = {"run": 1}
    step, _, log = resume(tmp_path, model=model, optimizer=opt, config=cfg, log_name="metrics.csv")
    assert step == 0
    for s in range(1, steps + 1):
        log.append({"step": s, "loss": 1.0 / s})
    save_state(tmp_path, step=steps, model=model, optimizer=opt, config=cfg)
    return model, opt, cfg


def test_resume_checks_the_step_log(tmp_path):
    model, opt, cfg = _state(tmp_path)
    step, _, log = resume(tmp_path, model=model, optimizer=opt, config=cfg, log_name="metrics.csv")
    assert step == 3 and len(log.rows()) == 3
    (tmp_path / "metrics.csv").unlink()  # deleted log: a resume would silently drop steps 1..3
    with pytest.raises(DamagedState, match=r"metrics.csv has no rows .* step 3.*--restart"):
        resume(tmp_path, model=model, optimizer=opt, config=cfg, log_name="metrics.csv")
    (tmp_path / "metrics.csv").write_text("step,loss\n1,1.0\n")  # cut short
    with pytest.raises(DamagedState, match=r"metrics.csv has steps 1..1"):
        resume(tmp_path, model=model, optimizer=opt, config=cfg, log_name="metrics.csv")
    step, _, log = resume(tmp_path, model=model, optimizer=opt, config=cfg, log_name="metrics.csv", restart=True)
    assert step == 0 and log.rows() == [] and not (tmp_path / "state.pt").exists()


def test_truncated_state_names_the_file(tmp_path):
    model, opt, cfg = _state(tmp_path)
    state = tmp_path / "state.pt"
    state.write_bytes(state.read_bytes()[:100])
    with pytest.raises(DamagedState, match=rf"{state} cannot be read.*--restart"):
        resume(tmp_path, model=model, optimizer=opt, config=cfg, log_name="metrics.csv")


def test_atomic_write_leaves_no_tmp_on_error(tmp_path, monkeypatch):
    target = tmp_path / "out.json"
    target.write_text("old")

    def boom(*a):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_bytes(target, b"new")
    assert target.read_text() == "old" and list(tmp_path.iterdir()) == [target]


# ---- the NVFP4 API contract ------------------------------------------------------------------------------------
@pytest.mark.parametrize("x, match", [
    (torch.zeros(0, 16), "empty tensor"),
    (torch.zeros(16, 0), "empty tensor"),
    (torch.ones(1, 16, dtype=torch.complex64), "real floating"),
    (torch.ones(1, 16, dtype=torch.int32), "real floating"),
    (torch.ones(1, 16).to(torch.float8_e4m3fn), "real floating"),
    (torch.full((1, 16), 1e39, dtype=torch.float64), "beyond fp32's range"),
    (torch.ones(16), "2D"),
    ([[1.0] * 16], "torch.Tensor"),
])
def test_quantize_rejects_inputs_outside_the_contract(x, match):
    with pytest.raises(ValueError, match=match):
        quantize(x)


@pytest.mark.parametrize("block", [(16,), "1x16", (1, 32), (True, 16), (1.0, 16.0), 16])
def test_quantize_rejects_malformed_blocks(block):
    with pytest.raises(ValueError, match="block must be"):
        quantize(torch.ones(16, 16), block=block)


def test_stochastic_rounding_needs_a_generator_or_seed():
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="generator.*seed"):
        quantize(x, rounding="sr")
    by_seed = quantize(x, rounding="sr", seed=7)
    by_gen = quantize(x, rounding="sr", generator=torch.Generator().manual_seed(7))
    assert torch.equal(by_seed.data, by_gen.data)


def test_float64_inside_fp32_range_is_fine():
    x = torch.randn(2, 16, dtype=torch.float64) * (FLT_MAX / 10)
    t = quantize(x)
    assert math.isfinite(float(dequantize(t).abs().max()))


def test_dequantize_checks_its_input():
    t = quantize(torch.randn(2, 32))
    with pytest.raises(ValueError, match="scale must be float8_e4m3fn"):
        dequantize(type(t)(t.data, t.scale.float(), t.global_scale))
    with pytest.raises(ValueError, match="NVFP4Tensor"):
        dequantize(torch.zeros(2, 16))


def test_result_json_is_written_atomically(tmp_path):
    from minite_core.results import write_result

    out = write_result(tmp_path / "r.json", stage="s", experiment="e", config={}, metrics={"x": 1.0})
    assert json.loads(out.read_text())["metrics"] == {"x": 1.0}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
