"""Real vLLM as the rollout engine (peers/vllm_rollout.py), on CPU against a stand-in with vLLM's API shape
(tests/fake_vllm.py: the engine loads the exported directory with our loaders and samples with our reference
sampler): the export vLLM loads (bf16 and NVFP4), generate -> the Sampler's Rollout, the weight push after an
update (the engine then runs the new weights, exactly as a fresh engine on them), a GRPO run through it, and the
one-line error naming what is missing when vLLM is not installed. The real engine: tests/test_vllm_peer.py (CPU
peer venv) and `python -m minite_core.peers.vllm_measure push-check` (results/vllm-cpu/vllm_push, the H200)."""
from __future__ import annotations

import dataclasses
import json
import sys
import types

import pytest
import torch

from minite_core.engines.sampler import Rollout, Sampler
from minite_core.experiment import semantic_errors
from minite_core.model import CausalLM, PRESETS, load_pretrained
from minite_core.model.calibrate import calibrate
from minite_core.model.io import read_safetensors
from minite_core.model.nvfp4_io import export_nvfp4
from minite_core.peers import vllm_rollout, vllm_sampler
from minite_core.task.tokenizer import build_tokenizer
from minite_core.task.tasks import ArithmeticTask
from tests import fake_vllm

MODEL = PRESETS["tiny-moe"]


@pytest.fixture
def fake(monkeypatch):
    for name, module in fake_vllm.modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(vllm_sampler, "available", lambda: (True, "vllm (stand-in)"))
    fake_vllm.CALLS.clear()
    return fake_vllm


def _model(seed=0, calibrated=False):
    model = CausalLM(MODEL).init_weights(seed, std=0.2)
    if calibrated:
        calibrate(model, [torch.randint(4, 60, (2, 9), generator=torch.Generator().manual_seed(seed))])
    return model


def _prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(4, 60, (n,), generator=g).tolist() for n in (5, 9, 3)]


# ---------------------------------------------------------------- without vLLM
def test_missing_vllm_is_one_line_naming_the_docs(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # not importable, whatever this environment has
    monkeypatch.setattr(vllm_sampler.importlib.util, "find_spec", lambda name: None)
    ok, reason = vllm_rollout.available()
    assert not ok and "vllm" in reason and vllm_rollout.DOCS in reason and "\n" not in reason
    with pytest.raises(RuntimeError, match="vllm: sampler cannot run.*docs/vllm-gpu.md"):
        vllm_rollout.VLLMRollout(_model(), "bf16", tokenizer=build_tokenizer())
    from minite_core.rl.train import RLConfig, train  # before any work: no checkpoint or data needed

    with pytest.raises(RuntimeError, match="docs/vllm-gpu.md"):
        train(pretrained="/nonexistent", data_dir="/nonexistent", out="/tmp/never", learner_profile="bf16",
              sampler_profile="vllm:bf16", correction="none", cfg=RLConfig(), seed=0, progress=False)


def test_modes_and_config_validation():
    assert vllm_rollout.sampler_mode("vllm:nvfp4") == "nvfp4" and vllm_rollout.sampler_mode("vllm-nvfp4") is None
    with pytest.raises(ValueError, match="unknown vLLM mode 'fp8'"):
        vllm_rollout.get_mode("fp8")
    from pathlib import Path

    from snakemake.utils import validate

    schema = Path(__file__).resolve().parents[1] / "workflow" / "schemas" / "config.schema.yaml"
    runs = [{"learner": "te:nvfp4", "sampler": "vllm:nvfp4"}, {"learner": "bf16", "sampler": "vllm:x"}]
    config = {"experiment": "t", "rl": {"runs": runs}}
    validate(config, str(schema))  # fills the defaults, as the Snakefile does
    errors = semantic_errors(config)
    assert errors == ["config: rl.runs[1].sampler: unknown vLLM mode 'x'; one of bf16, nvfp4, nvfp4-emulation"]


# ---------------------------------------------------------------- export
def test_bf16_export_is_our_checkpoint_without_scales(tmp_path):
    model = _model(calibrated=True)
    path = vllm_rollout.export(model, "bf16", tmp_path / "ck", build_tokenizer())
    files = read_safetensors(path)
    assert not [k for k in files if k.endswith("input_amax")]  # vLLM's loader rejects unknown names
    assert all(t.dtype == torch.bfloat16 for t in files.values())
    back = load_pretrained(path)
    for (n, p), (_, q) in zip(model.named_parameters(), back.named_parameters()):
        assert torch.equal(p.to(torch.bfloat16).float(), q), n
    assert (path / "tokenizer.json").exists()


def test_nvfp4_export_is_the_compressed_tensors_file(tmp_path):
    model = _model(calibrated=True)
    ours = vllm_rollout.export(model, "nvfp4", tmp_path / "a")
    ref = export_nvfp4(model, tmp_path / "b", profile="vllm-nvfp4")
    assert (ours / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes()
    assert json.loads((ours / "config.json").read_text()) == json.loads((ref / "config.json").read_text())


# ---------------------------------------------------------------- with the stand-in
def test_generate_returns_the_samplers_rollout(fake):
    model, tok = _model(), build_tokenizer()
    eng = vllm_rollout.VLLMRollout(model, "bf16", tokenizer=tok, seed=0, full_rows=True)
    r = eng.generate(_prompts(), max_new_tokens=6, seed=4, keep_logprob_rows=True)
    assert isinstance(r, Rollout) and {f.name for f in dataclasses.fields(r)} == \
        {f.name for f in dataclasses.fields(Rollout)}
    assert r.prompt_ids == _prompts() and len(r) == 3
    for ids, lps, amx, rows in zip(r.response_ids, r.logprobs, r.argmax_ids, r.logprob_rows):
        assert len(ids) == len(lps) == len(amx) == rows.shape[0] and rows.shape[1] == model.config.vocab_size
        assert torch.equal(rows[torch.arange(len(ids)), torch.tensor(ids)], torch.tensor(lps))  # the sampled token's
        assert amx == rows.argmax(-1).tolist()
    # the engine ran the exported bf16 weights: request i = our sampler on the bf16 model with vLLM's seed for i
    bf16 = load_pretrained(eng.checkpoint)
    from minite_core.seeds import derive_seed

    ref = Sampler(bf16, "bf16").generate([_prompts()[1]], max_new_tokens=6, seed=derive_seed(4, 1))
    assert r.response_ids[1] == ref.response_ids[0] and r.logprobs[1] == ref.logprobs[0]
    assert r.routes is None
    with pytest.raises(ValueError, match="routing"):
        eng.generate(_prompts(), max_new_tokens=2, seed=0, record_routes=True)


@pytest.mark.parametrize("mode", ["bf16", "nvfp4", "nvfp4-emulation"])
def test_push_after_an_update_equals_a_fresh_engine(fake, mode):
    model, tok = _model(calibrated=True), build_tokenizer()
    eng = vllm_rollout.VLLMRollout(model, mode, tokenizer=tok, seed=0)
    before = eng.generate(_prompts(), max_new_tokens=8, seed=2)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    loss = sum(p.float().pow(2).mean() for p in model.parameters())
    loss.backward()
    opt.step()
    eng.push_weights()
    assert [c[0] for c in fake.CALLS[-2:]] == ["reload_weights", "reset_prefix_cache"] and eng.pushes == 1
    after = eng.generate(_prompts(), max_new_tokens=8, seed=2)
    fresh = vllm_rollout.VLLMRollout(model, mode, tokenizer=tok, seed=0).generate(_prompts(), max_new_tokens=8,
                                                                                   seed=2)
    assert after.response_ids == fresh.response_ids and after.logprobs == fresh.logprobs
    assert after.logprobs != before.logprobs  # the update reached the engine
    assert vllm_rollout.get_mode(mode).llm_kwargs.items() <= fake.CALLS[0][1].items()  # emulation: vLLM's own


class _ReloadingWorker:
    """vLLM's worker as reload_weights_in_place meets it: the layerwise reload copies the re-processed parameter
    into its old storage, while processing makes the derived scale and the kernel's workspace anew as plain
    attributes (as the compressed-tensors NVFP4 MoE and Marlin do)."""

    def __init__(self):
        self.layer = torch.nn.Linear(4, 4, bias=False)
        self._process()
        self.model_runner = types.SimpleNamespace(get_model=lambda: torch.nn.Sequential(self.layer))

    def _process(self):
        self.layer.weight_scale_2 = self.layer.weight.detach().abs().amax() / 6
        self.layer.workspace = torch.zeros(8, dtype=torch.int32)

    def reload_weights(self, weights_iterator, is_checkpoint_format):
        assert is_checkpoint_format
        with torch.no_grad():
            self.layer.weight.copy_(dict(weights_iterator)["weight"])
        self._process()


def test_reload_keeps_the_tensors_captured_graphs_read(monkeypatch):
    monkeypatch.setattr(vllm_sampler, "GRAPH_DEVICES", ("cpu",))  # this CPU stands in for the GPU
    w = _ReloadingWorker()
    graph = (w.layer.weight, w.layer.weight_scale_2, w.layer.workspace)  # what a graph captured at start reads
    new = torch.randn(4, 4, generator=torch.Generator().manual_seed(0)) * 3
    vllm_sampler.reload_weights_in_place(w, [("weight", new)])
    assert all(a is b for a, b in zip(graph, (w.layer.weight, w.layer.weight_scale_2, w.layer.workspace)))
    assert torch.equal(graph[0], new) and torch.equal(graph[1], new.abs().amax() / 6)
    w.reload_weights([("weight", new * 2)], True)  # vLLM's reload alone: the captured scale goes stale
    assert not torch.equal(graph[1], w.layer.weight_scale_2)
    w = _ReloadingWorker()
    w._process = lambda: setattr(w.layer, "workspace", torch.zeros(16, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="Linear.workspace by something of another shape"):
        vllm_sampler.reload_weights_in_place(w, [("weight", new)])


def test_kernels_are_read_from_the_engine(fake):
    eng = vllm_rollout.VLLMRollout(_model(), "bf16", tokenizer=build_tokenizer())
    assert isinstance(eng.kernels(), dict)  # (our modules have no quant_method: an empty description)


# ---------------------------------------------------------------- RL through it
def test_grpo_runs_with_the_vllm_sampler(fake, tmp_path, monkeypatch):
    """Two GRPO steps with sampler vllm:bf16: every rollout comes from the engine, the weights are pushed after
    every update (and after a resume), and the logged sampler log-probs are the engine's."""
    from tests.test_rl_loop import DATA, RL, TINY
    from minite_core.rl import train as train_mod
    from minite_core.rl.pretrain import pretrain
    from minite_core.task import data as data_mod

    monkeypatch.setattr(ArithmeticTask, "reward", lambda self, text, row, credit=0.0: float("7" in text))
    data_mod.main(["--out", str(tmp_path / "data"), "--config-json", json.dumps(DATA)])
    pretrain(TINY, data_dir=tmp_path / "data", out=tmp_path / "pre", state_dir=tmp_path / "ps", seed=0,
             progress=False)
    kw = dict(pretrained=tmp_path / "pre" / "model", data_dir=tmp_path / "data", out=tmp_path / "run",
              learner_profile="bf16", sampler_profile="vllm:bf16", correction="none",
              cfg=dataclasses.replace(RL, steps=3), seed=5, progress=False)
    assert train_mod.train(**kw, stop_after=2) == {"stopped_at": 2}
    calls = [c[0] for c in fake.CALLS]
    assert calls.count("reload_weights") == 2 and calls[0] == "LLM"  # one push per update
    fake.CALLS.clear()
    summary = train_mod.train(**kw)  # resume: the resumed weights are pushed before step 3, then one push
    calls = [c[0] for c in fake.CALLS]
    assert calls.count("reload_weights") == 2 and calls.index("reload_weights") < calls.index("generate")
    assert summary["steps"] == 3 and summary["mismatch/k3_mean"] >= 0
    cfg = json.loads((tmp_path / "run" / "summary.json").read_text())["config"]
    assert cfg["sampler"] == "vllm:bf16" and cfg["sampler_engine"] == "vllm"


def test_grpo_te_learner_with_the_vllm_sampler(fake, tmp_path, monkeypatch):
    """The paper's naive stack as users run it, plumbing only: learner te:bf16 (Transformer Engine's API shape,
    tests/fake_te.py) and sampler vllm:bf16. The TE copy shares the model's storage, so the optimizer's steps on
    it (dense weights and per-expert views) move the model's weights, and those are what reach the engine."""
    from tests import fake_te
    from tests.test_rl_loop import DATA, RL, TINY
    from minite_core.peers import te_learner
    from minite_core.rl import train as train_mod
    from minite_core.rl.pretrain import pretrain
    from minite_core.task import data as data_mod

    for name, module in fake_te.modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(te_learner, "require", lambda: None)
    monkeypatch.setattr(te_learner, "_require_cuda_model", lambda model: None)
    monkeypatch.setattr(te_learner, "_RECIPES", {})
    monkeypatch.setattr(ArithmeticTask, "reward", lambda self, text, row, credit=0.0: float("7" in text))
    data_mod.main(["--out", str(tmp_path / "data"), "--config-json", json.dumps(DATA)])
    pretrain(TINY, data_dir=tmp_path / "data", out=tmp_path / "pre", state_dir=tmp_path / "ps", seed=0,
             progress=False)
    pushed = []
    monkeypatch.setattr(vllm_rollout.VLLMRollout, "push_weights", lambda self: pushed.append(
        {k: v.clone() for k, v in vllm_rollout.checkpoint_tensors(self.model, self.mode)[0].items()}))
    start = vllm_rollout.checkpoint_tensors(load_pretrained(tmp_path / "pre" / "model"), "bf16")[0]
    summary = train_mod.train(pretrained=tmp_path / "pre" / "model", data_dir=tmp_path / "data",
                              out=tmp_path / "run", learner_profile="te:bf16", sampler_profile="vllm:bf16",
                              correction="none", cfg=dataclasses.replace(RL, steps=2), seed=5, progress=False)
    assert summary["steps"] == 2 and len(pushed) == 2
    moved = {k for k in start if not torch.equal(start[k], pushed[-1][k])}
    assert any(".experts." in k for k in moved) and any("self_attn" in k for k in moved), sorted(moved)[:6]
    final = vllm_rollout.checkpoint_tensors(load_pretrained(tmp_path / "run" / "final"), "bf16")[0]
    assert all(torch.equal(final[k], pushed[-1][k]) for k in final)  # the engine got the policy's last weights
    cfg = json.loads((tmp_path / "run" / "summary.json").read_text())["config"]
    assert (cfg["learner"], cfg["sampler"]) == ("te:bf16", "vllm:bf16")
