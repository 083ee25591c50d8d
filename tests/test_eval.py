"""lm-eval integration: the `minite` model, the task YAML builder, `minite eval`, and the peer check against
lm-eval's own `hf` model (same checkpoint, transformers in fp32 vs minite's bf16 profile promoted to fp32)."""
from __future__ import annotations

import json
import math
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is in the [workflow] extra")

from lm_eval.api.instance import Instance  # noqa: E402

from minite_core.eval import (  # noqa: E402
    MiniteLM, TaskSpec, build_tasks, eval_profile, process_results_gen, task_manager)
from minite_core.eval.cli import main as eval_main  # noqa: E402
from minite_core.report.tables import eval_table  # noqa: E402
from minite_core.eval.tasks import TASKS, select, task_docs  # noqa: E402
from minite_core.model import PRESETS, CausalLM, save_pretrained  # noqa: E402
from minite_core.task.arithmetic import TaskConfig, make_splits  # noqa: E402
from minite_core.task.jsonl import read_jsonl, write_jsonl  # noqa: E402
from minite_core.task.tokenizer import BOS_ID, EOS_ID, PAD_ID, build_tokenizer, save_tokenizer  # noqa: E402

N_DOCS = 8  # per task in the peer check: 4 add2 + 4 add3 (round-robin)
GEN_TOKS = 24  # enough to exercise EOS / "\n\n" stops and the KV cache; keeps hf's generate fast on CPU


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """Random tiny MoE (std 0.3: peaked, non-degenerate distributions) in transformers format + tokenizer."""
    d = tmp_path_factory.mktemp("ckpt") / "run0" / "final"
    cfg = PRESETS["tiny-moe"].replace(max_position_embeddings=512, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
                                      pad_token_id=PAD_ID)
    save_pretrained(CausalLM(cfg).init_weights(seed=1, std=0.3), d)
    save_tokenizer(build_tokenizer(), d)
    return d


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    train, heldout = make_splits(TaskConfig(levels=(0, 1), n_train_per_level=16, n_heldout_per_level=8))
    write_jsonl(train, d / "train.jsonl")
    write_jsonl(heldout, d / "heldout.jsonl")
    return d


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory, data_dir):
    return build_tasks(data_dir / "heldout.jsonl", tmp_path_factory.mktemp("tasks"), TaskSpec(max_gen_toks=GEN_TOKS),
                       limit=N_DOCS)


def _evaluate(model, model_args, tasks_dir, tasks):
    return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=list(tasks),
                                   task_manager=task_manager(tasks_dir), log_samples=True, bootstrap_iters=1000)


# ----------------------------------------------------------------------------------------------- peer check
def test_peer_check_hf_vs_minite(ckpt, tasks_dir):
    """Same checkpoint, lm-eval's transformers model vs ours (bf16 profile in fp32): same scores, same samples."""
    tasks = ("heldout_gen", "heldout_mc")
    ref = _evaluate("hf", f"pretrained={ckpt},dtype=float32,device=cpu,batch_size=4", tasks_dir, tasks)
    sut = _evaluate("minite", f"pretrained={ckpt},profile=bf16,dtype=float32,batch_size=4", tasks_dir, tasks)
    for task in tasks:
        m_ref = {k: v for k, v in ref["results"][task].items() if "," in k}
        m_sut = {k: v for k, v in sut["results"][task].items() if "," in k}
        assert m_ref == m_sut, (task, m_ref, m_sut)
        rows_ref = sorted(ref["samples"][task], key=lambda r: r["doc_id"])
        rows_sut = sorted(sut["samples"][task], key=lambda r: r["doc_id"])
        assert len(rows_ref) == len(rows_sut) == N_DOCS
        for r_ref, r_sut in zip(rows_ref, rows_sut):
            if task == "heldout_gen":
                assert r_ref["filtered_resps"] == r_sut["filtered_resps"]  # greedy text, token for token
            else:
                lp_ref = [lp for lp, _ in r_ref["filtered_resps"]]
                lp_sut = [lp for lp, _ in r_sut["filtered_resps"]]
                assert lp_sut == pytest.approx(lp_ref, abs=1e-4)
                assert [g for _, g in r_ref["filtered_resps"]] == [g for _, g in r_sut["filtered_resps"]]
    # not degenerate: the random model's choices are neither all right nor all wrong, and it generates text
    acc = sut["results"]["heldout_mc"]["acc,none"]
    assert 0.0 < acc < 1.0
    assert any(r["filtered_resps"][0] for r in sut["samples"]["heldout_gen"])


def test_rolling_loglikelihood_matches_transformers(ckpt, data_dir):
    """loglikelihood_rolling = sum of log p(text token | <bos>, previous tokens) by transformers, in one window
    and across several (max_length 48 < text length)."""
    from transformers import AutoModelForCausalLM

    from lm_eval import utils as lm_utils

    hf = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()
    ex = read_jsonl(data_dir / "heldout.jsonl")[0]
    text = ex["prompt"] + ex["response"]
    tok = build_tokenizer()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    req = [Instance("loglikelihood_rolling", {}, (text,), 0)]

    def ref(max_len):
        total = 0.0
        for ctx, cont in map(lm_utils.make_disjoint_window,
                             lm_utils.get_rolling_token_windows(ids, BOS_ID, max_len, 1)):
            inp = torch.tensor([(ctx + cont)[:-1]])
            with torch.no_grad():
                logp = torch.log_softmax(hf(inp).logits.float(), -1)[0, -len(cont):]
            total += float(logp.gather(-1, torch.tensor(cont)[:, None]).sum())
        return total

    for max_len in (512, 48):
        lm = MiniteLM(pretrained=str(ckpt), profile="bf16", dtype="float32", max_length=max_len)
        assert lm.loglikelihood_rolling(req)[0] == pytest.approx(ref(max_len), rel=1e-5)


# ----------------------------------------------------------------------------------------------- profiles
def test_eval_profile_dtype():
    p = eval_profile("bf16", "float32")
    assert (p.dtype, p.router_dtype, p.lm_head_dtype) == ("float32",) * 3
    assert eval_profile("minite") is eval_profile("minite", "auto")
    with pytest.raises(ValueError, match="dtype"):
        eval_profile("bf16", "fp16")


def test_quantized_profiles_and_calibration(ckpt, data_dir, tmp_path):
    """NVFP4 profiles score the same requests close to (not equal to) the high-precision model; a static-scale
    profile without calibration data is an error that says what to pass."""
    docs = task_docs(read_jsonl(data_dir / "heldout.jsonl")[:2], TaskSpec())
    reqs = [Instance("loglikelihood", {}, (d["context"], " " + c), i)
            for i, d in enumerate(docs) for c in d["choices"]]
    ref = [lp for lp, _ in MiniteLM(pretrained=str(ckpt), profile="bf16", dtype="float32").loglikelihood(reqs)]
    with pytest.raises(ValueError, match="calib=PATH.jsonl"):
        MiniteLM(pretrained=str(ckpt), profile="vllm-nvfp4")
    for profile, calib in (("minite", None), ("vllm-nvfp4", data_dir / "train.jsonl")):
        lm = MiniteLM(pretrained=str(ckpt), profile=profile, calib=str(calib) if calib else None, calib_n=4)
        sut = [lp for lp, _ in lm.loglikelihood(reqs)]
        assert all(math.isfinite(x) for x in sut)
        assert sut != ref
        assert max(abs(a - b) for a, b in zip(sut, ref)) < 0.5 * max(abs(x) for x in ref)
    assert lm.calibration["source"] == str(data_dir / "train.jsonl")
    # the calibrated scales travel with a saved checkpoint and take precedence over calibration data
    saved = save_pretrained(lm.model, tmp_path / "calibrated")
    save_tokenizer(build_tokenizer(), saved)
    again = MiniteLM(pretrained=str(saved), profile="vllm-nvfp4", calib=str(data_dir / "train.jsonl"))
    assert again.calibration == {"source": "checkpoint"}
    assert [lp for lp, _ in again.loglikelihood(reqs)] == pytest.approx(sut, abs=1e-5)


# ----------------------------------------------------------------------------------------------- tasks
def test_process_results_gen_robust_to_whitespace():
    doc = {"answer": "132"}
    assert process_results_gen(doc, ["add 47+85\n7+5+0=12 -> 2\nanswer: 132"]) == {"exact_match": 1.0}
    assert process_results_gen(doc, ["  \n answer:132  "]) == {"exact_match": 1.0}
    assert process_results_gen(doc, ["answer: 0132"]) == {"exact_match": 1.0}  # integer comparison
    assert process_results_gen(doc, ["answer: 131"]) == {"exact_match": 0.0}
    assert process_results_gen(doc, ["the answer is 132"]) == {"exact_match": 0.0}
    assert process_results_gen(doc, [""]) == {"exact_match": 0.0}


def test_build_tasks(tasks_dir, data_dir):
    text = (tasks_dir / "heldout_gen.yaml").read_text()
    assert "process_results: !function minite_core.eval.tasks.process_results_gen" in text
    assert "dataset_path: json" in text and str(tasks_dir / "heldout_docs.jsonl") in text
    docs = read_jsonl(tasks_dir / "heldout_docs.jsonl")
    heldout = read_jsonl(data_dir / "heldout.jsonl")
    assert len(docs) == N_DOCS and sorted({d["level"] for d in docs}) == [0, 1]  # limit covers every level
    for d in docs:
        assert d["choices"][d["gold"]] == d["answer"] and len(set(d["choices"])) == 4
        assert d["context"].endswith("answer:") and d["context"].startswith(d["prompt"])
        assert d["text"] == heldout[d["doc_index"]]["prompt"] + heldout[d["doc_index"]]["response"]
    # a doc's candidates depend on its index in the split, not on the limit
    full = task_docs(heldout, TaskSpec())
    assert all(full[d["doc_index"]]["choices"] == d["choices"] for d in docs)
    names = set(task_manager(tasks_dir).all_tasks)
    assert set(TASKS) <= names and "hellaswag" not in names
    with pytest.raises(ValueError, match="unknown tasks"):
        build_tasks(data_dir / "heldout.jsonl", tasks_dir / "x", tasks=("gsm8k",))


def test_select_round_robin():
    rows = [{"level": lv} for lv in (0, 0, 0, 1, 1, 2)]
    assert [i for i, _ in select(rows, 4)] == [0, 1, 3, 5]
    assert [i for i, _ in select(rows, None)] == list(range(6))


# ----------------------------------------------------------------------------------------------- CLI + table
def test_cli_writes_result_and_table(ckpt, data_dir, tmp_path):
    out = tmp_path / "eval" / "run0__bf16.json"
    rc = eval_main(["--checkpoint", str(ckpt), "--profile", "bf16", "--data-dir", str(data_dir), "--out", str(out),
                    "--tasks", "heldout_gen,heldout_mc,heldout_ppl", "--limit", "4", "--experiment", "test",
                    "--spec-json", json.dumps({"max_gen_toks": 8})])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["schema"] == "eval/v1" and res["experiment"] == "test"
    assert res["config"]["run"] == "run0" and res["config"]["profile"] == "bf16"
    assert {"heldout_gen/exact_match", "heldout_mc/acc", "heldout_mc/acc_stderr",
            "heldout_ppl/bits_per_byte"} <= set(res["metrics"])
    assert res["n_docs"] == {"heldout_gen": 4, "heldout_mc": 4, "heldout_ppl": 4}
    assert set(res["by_level"]["heldout_mc"]) == {"add2", "add3"}
    other = {**res, "config": {**res["config"], "profile": "minite"}}
    table = eval_table([out, other])
    lines = table.strip().splitlines()
    assert lines[0].startswith("| run | profile | heldout_gen exact_match | heldout_mc acc | heldout_ppl bits_per_byte")
    assert len(lines) == 4 and "| run0 | bf16 |" in lines[2] and "| run0 | minite |" in lines[3]
