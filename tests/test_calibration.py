"""Static activation scales: one checkpoint and one set of examples give bit-identical scales in every stage, and
pads never enter an amax (model/calibrate.py's pad rule).

Each stage is driven through its own entry point: RL (`rl.train.calibrate_static`, what `train` calls), lm-eval
(`MiniteLM(calib=...)`), diagnostics (`calibrate_for_diagnose`, what `minite diagnose --calib` calls), the NVFP4
export (`minite export --calib-jsonl`, read back from the written checkpoint) and the vLLM comparison
(`vllm_compare.calibrate_dense`). The static scale compared is S_enc = 2688 / amax, what a checkpoint stores.
"""
import argparse

import pytest
import torch

from minite_core.formats.nvfp4 import global_encode_scale
from minite_core.model import PRESETS, CausalLM, load_pretrained, save_pretrained, set_profile
from minite_core.model.calibrate import calibrate, calibration_batches
from minite_core.model.nvfp4_io import load_nvfp4
from minite_core.nn import gemm_modules
from minite_core.profiles import get_profile
from minite_core.task.arithmetic import TaskConfig, make_splits
from minite_core.task.jsonl import write_jsonl
from minite_core.task.tokenizer import PAD_ID, build_tokenizer, calibration_sequences, save_tokenizer

N_CALIB, SEED = 12, 3
STATIC = get_profile("vllm-nvfp4")


@pytest.fixture(scope="module")
def setup(tmp_path_factory, one_thread):
    root = tmp_path_factory.mktemp("calib")
    cfg = PRESETS["tiny-moe"].replace(vocab_size=64, hidden_size=64, intermediate_size=64, moe_intermediate_size=32)
    model = CausalLM(cfg).init_weights(0, std=0.2)
    ckpt = root / "ckpt"
    save_pretrained(model, ckpt)
    tok = build_tokenizer()
    save_tokenizer(tok, ckpt)
    train, heldout = make_splits(TaskConfig(levels=(0, 1), n_train_per_level=16, n_heldout_per_level=4))
    write_jsonl(train, root / "train.jsonl")
    return {"root": root, "ckpt": ckpt, "tok": tok, "train": train, "heldout": heldout}


def _scales(model) -> dict[str, torch.Tensor]:
    return {n: global_encode_scale(m.input_amax.float().reshape(-1)[0])
            for n, m in gemm_modules(model, linear_only=True)}


def _fresh(setup):
    return load_pretrained(setup["ckpt"])


def _rl(setup):
    from minite_core.rl.train import calibrate_static

    model = _fresh(setup)
    calibrate_static(model, (STATIC, get_profile("te-nvfp4")), setup["tok"], setup["train"], N_CALIB, SEED)
    return _scales(model)


def _eval(setup):
    from minite_core.eval.lm import MiniteLM

    lm = MiniteLM(pretrained=str(setup["ckpt"]), profile="vllm-nvfp4", calib=str(setup["root"] / "train.jsonl"),
                  calib_n=N_CALIB, seed=SEED)
    return _scales(lm.model)


def _diagnostics(setup):
    from minite_core.diagnostics.cli import calibrate_for_diagnose

    model = _fresh(setup)
    set_profile(model, STATIC)
    args = argparse.Namespace(calib=str(setup["root"] / "train.jsonl"), num_calib=N_CALIB, seed=SEED,
                              max_new_tokens=8)
    prompts = [setup["tok"](e["prompt"])["input_ids"] for e in setup["heldout"]]
    calibrate_for_diagnose(model, args, prompts, setup["tok"], model.config.vocab_size)
    return _scales(model)


def _export(setup):
    from minite_core.peers.export import main

    out = setup["root"] / "nvfp4"
    assert main(["--model", str(setup["ckpt"]), "--out", str(out), "--calib-jsonl",
                 str(setup["root"] / "train.jsonl"), "--calib-rows", str(N_CALIB), "--seed", str(SEED)]) == 0
    model, _ = load_nvfp4(out)
    return _scales(model)


def _vllm_compare(setup):
    from minite_core.peers.vllm_compare import calibrate_dense
    from minite_core.task.data import calibration_examples

    model = _fresh(setup)
    set_profile(model, STATIC)
    calibrate_dense(model, setup["tok"], calibration_examples(setup["train"], N_CALIB, SEED), SEED)
    return _scales(model)


@pytest.mark.parametrize("stage", [_eval, _diagnostics, _export, _vllm_compare], ids=lambda f: f.__name__[1:])
def test_same_static_scales_in_every_stage(setup, stage):
    ref = _rl(setup)
    sut = stage(setup)
    assert sut.keys() == ref.keys()
    differ = [n for n in ref if not torch.equal(ref[n], sut[n])]
    assert not differ, f"{stage.__name__[1:]} scales differ from RL's at {differ[:4]}"


def _spike(model):
    """The pad embedding as one spike: after RMSNorm it is sqrt(D) = 8 in one feature, above every real token."""
    with torch.no_grad():
        model.model.embed_tokens.weight[PAD_ID] = 0.0
        model.model.embed_tokens.weight[PAD_ID, 0] = 1e4


def test_pads_never_enter_an_amax(setup):
    """Padded batches give the same amax whatever the pad token's embedding is (dense and expert GEMMs alike)."""
    seqs = calibration_sequences(setup["tok"], setup["train"][:10])
    assert len({len(s) for s in seqs}) > 1  # the batches hold pads
    batches = calibration_batches(seqs, batch_size=5, pad_id=PAD_ID)

    ref_model, sut_model = _fresh(setup), _fresh(setup)
    _spike(sut_model)
    assert calibrate(ref_model, batches) == calibrate(sut_model, batches)


def test_unmasked_pads_would_change_the_amax(setup):
    """The same batches without their attention mask (pads counted as tokens) do change it: the test above can
    fail."""
    seqs = calibration_sequences(setup["tok"], setup["train"][:10])
    batches = [{"input_ids": b["input_ids"]} for b in calibration_batches(seqs, batch_size=5, pad_id=PAD_ID)]
    masked = calibrate(_fresh(setup), calibration_batches(seqs, batch_size=5, pad_id=PAD_ID))
    model = _fresh(setup)
    _spike(model)
    unmasked = calibrate(model, batches)
    q = "model.layers.0.self_attn.q_proj"
    assert unmasked[q] > 7.9 > masked[q]


def test_calibration_inputs_are_checked():
    with pytest.raises(ValueError, match="at least one sequence"):
        calibration_batches([])
    with pytest.raises(ValueError, match="must not be empty"):
        calibration_batches([[1, 2], []])
