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
from minite_core.runs.state import DamagedState, OtherRun, read_state_file, resume, save_state
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


def test_a_flipped_byte_in_a_checkpoint_names_the_file(tmp_path):
    ckpt = _tiny(tmp_path)
    weights = ckpt / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[-5] ^= 0x01  # a bit of the last weight: safetensors alone would load it
    weights.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=rf"{weights} is damaged"):
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


# ---- inputs against the model: positions, vocabulary ------------------------------------------------------------
def test_sequences_beyond_the_models_positions_are_errors():
    from minite_core.engines import Learner, Sampler

    model = CausalLM(PRESETS["tiny-moe"]).init_weights(0)  # max_position_embeddings 256, vocabulary 64
    with pytest.raises(ValueError, match=r"prompt 1 has 200 tokens \+ 100 new tokens = 300 positions > the "
                                         r"model's max_position_embeddings 256; lower max_new_tokens"):
        Sampler(model, "bf16").generate([[1, 2], [5] * 200], max_new_tokens=100, seed=0)
    with pytest.raises(ValueError, match="prompt \\+ response 0 has 257 tokens"):
        Learner(model, "bf16").logprobs([[1] * 200], [[2] * 57])


def test_token_ids_outside_the_vocabulary_are_errors():
    from minite_core.engines import Learner, Sampler

    model = CausalLM(PRESETS["tiny-moe"]).init_weights(0)
    with pytest.raises(ValueError, match="prompt 0 holds token id 64, outside the model's vocabulary of 64"):
        Sampler(model, "bf16").generate([[1, 64]], max_new_tokens=2, seed=0)
    with pytest.raises(ValueError, match="holds token id -1"):
        Learner(model, "bf16").logprobs([[1, 2]], [[-1]])


def test_rl_with_responses_past_the_models_positions_is_one_line(tmp_path):
    from minite_core.task import data as data_mod

    data_mod.main(["--out", str(tmp_path / "data"), "--config-json",
                   '{"levels": ["add2"], "n_train_per_level": 8, "n_heldout_per_level": 2}'])
    from minite_core.task.tokenizer import build_tokenizer, save_tokenizer

    ckpt = save_tokenizer(build_tokenizer(), _tiny(tmp_path))
    res = _minite("rl", "--pretrained", str(ckpt), "--data", str(tmp_path / "data"), "--out", str(tmp_path / "r"),
                  "--learner", "bf16", "--sampler", "bf16", "--no-progress", "--config-json",
                  '{"steps": 1, "max_new_tokens": 600, "eval_n": 2, "calibration_examples": 2}')
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1, res.stderr[-2000:]
    assert "max_position_embeddings 256" in lines[0] and lines[0].startswith("minite rl: error: prompt")


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
    with pytest.raises(DamagedState, match=rf"{state} is damaged: its sha256 .*--restart"):
        resume(tmp_path, model=model, optimizer=opt, config=cfg, log_name="metrics.csv")
    state.write_bytes(b"garbage")
    with pytest.raises(DamagedState, match=rf"{state} is not a minite state file"):
        resume(tmp_path, model=model, optimizer=opt, config=cfg, log_name="metrics.csv")


def test_a_flipped_byte_in_the_state_names_the_file(tmp_path):
    model, opt, cfg = _state(tmp_path)
    state = tmp_path / "state.pt"
    raw = bytearray(state.read_bytes())
    raw[len(raw) // 2] ^= 0x01  # one bit of a tensor's payload: torch.load would read it without a word
    state.write_bytes(bytes(raw))
    with pytest.raises(DamagedState, match=rf"{state} is damaged"):
        resume(tmp_path, model=model, optimizer=opt, config=cfg, log_name="metrics.csv")


def test_a_state_without_checksum_still_loads(tmp_path):
    """A state.pt written by plain torch.save (before checksums) is read as it is: its config decides."""
    model, opt, cfg = _state(tmp_path)
    state = tmp_path / "state.pt"
    torch.save(read_state_file(state), state)
    step, _, _ = resume(tmp_path, model=model, optimizer=opt, config=cfg, log_name="metrics.csv")
    assert step == 3


def test_another_config_never_overwrites_a_run(tmp_path):
    run, state_dir = tmp_path / "run", tmp_path / "run" / "state"
    model, opt = torch.nn.Linear(4, 4), None
    opt = torch.optim.AdamW(model.parameters())
    kw = dict(model=model, optimizer=opt, log_name="metrics.csv", run_dir=run, outputs=("summary.json",),
              result="summary.json")
    _, _, log = resume(state_dir, config={"lr": 1e-4, "learner": "bf16"}, **kw)
    log.append({"step": 1, "loss": 1.0})
    save_state(state_dir, step=1, model=model, optimizer=opt, config={"lr": 1e-4, "learner": "bf16"})
    (run / "summary.json").write_text('{"config": {"lr": 0.0001, "learner": "bf16"}}')
    other = {"lr": 1e-3, "learner": "bf16"}
    with pytest.raises(OtherRun, match=r"holds a run of another config \(lr: 0.0001 -> 0.001\); give this run "
                                       r"another --out, or pass --restart"):
        resume(state_dir, config=other, **kw)
    assert (state_dir / "state.pt").exists() and (run / "summary.json").exists()  # untouched
    (state_dir / "state.pt").unlink()  # a finished run whose state is gone: its results file still guards it
    with pytest.raises(OtherRun, match="lr: 0.0001 -> 0.001"):
        resume(state_dir, config=other, **kw)
    step, _, _ = resume(state_dir, config=other, restart=True, **kw)
    kept = list((run / "previous").iterdir())
    assert step == 0 and len(kept) == 1 and (kept[0] / "summary.json").exists()
    assert (kept[0] / "state" / "metrics.csv").exists() and not (run / "summary.json").exists()
    save_state(state_dir, step=1, model=model, optimizer=opt, config=other)
    step, _, _ = resume(state_dir, config={"lr": 1e-2, "learner": "bf16"}, on_change="restart", **kw)
    assert step == 0 and len(list((run / "previous").iterdir())) == 2  # the DAG's choice: kept, then over


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
    assert torch.equal(quantize(x, rounding="sr", seed=7).data, quantize(x, rounding="sr", seed=7).data)
    g = quantize(x, rounding="sr", generator=torch.Generator().manual_seed(7))
    assert torch.equal(g.data, quantize(x, rounding="sr", generator=torch.Generator().manual_seed(7)).data)


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


def test_the_bad_input_table_names_real_tests():
    """docs/bad-input.md: every `file.py::test` it cites exists (a row without its test would be a claim)."""
    import re

    text = (ROOT / "docs" / "bad-input.md").read_text()
    cited, current = [], None
    for m in re.finditer(r"`(test_\w+\.py)?::(test_\w+)`", text):
        current = m.group(1) or current  # "`::test_x`" continues the file cited before it
        cited.append((current, m.group(2)))
    assert len(cited) > 30
    for file, name in cited:
        assert re.search(rf"^def {name}\(", (ROOT / "tests" / file).read_text(), flags=re.M), (file, name)
