"""Your model, your data, your benchmark, end to end on CPU: a tiny random Qwen3-MoE in Hugging Face's format
(two bf16 shards + index, a BPE tokenizer with a chat template, written by transformers) and 50 GSM8K-style
problems (verl's parquet layout for RL, GSM8K's own for lm-eval). The experiment's DAG is planned by Snakemake
(no data generation, no pretraining: your checkpoint is the base model), and the commands it plans — importing
the data, the diagnostics, two GRPO steps, lm-eval's own gsm8k task offline, the report — run as planned, in
this process (the benchmarks and kernel checks, which do not depend on your model's files, are left out)."""
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_fixture import gsm8k_problems, verl_rows, write_checkpoint, write_jsonl, write_parquet
from minite_core import cli
from minite_core.model import load_pretrained, set_profile
from minite_core.profiles import PROFILES
from minite_core.results import read_result

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("data", "diagnostics", "rl", "rl_figures", "eval_checkpoint", "report")  # in dependency order
SKIPPED = {"kernels_check", "quant_error", "throughput", "throughput_sampler", "all"}


def _experiment(root: Path) -> Path:
    problems = gsm8k_problems(50, seed=7)
    write_parquet(verl_rows(problems[:40], "train"), root / "train.parquet")
    write_parquet(verl_rows(problems[40:], "test"), root / "heldout.parquet")
    write_jsonl(problems[40:], root / "gsm8k_test.jsonl")
    write_jsonl(problems[:40], root / "gsm8k_train.jsonl")
    exp = root / "tiny-hf.yaml"
    exp.write_text(f"""
experiment: tiny-hf
device: cpu
model: {{path: {root / 'model'}}}
data: {{train: {root / 'train.parquet'}, heldout: {root / 'heldout.parquet'}}}
rl: {{steps: 2, prompts_per_step: 2, group_size: 2, mini_batches: 1, max_new_tokens: 12, eval_every: 2, eval_n: 4,
     checkpoint_every: 2, runs: [{{learner: minite, sampler: minite}}]}}
diagnostics: {{num_prompts: 4, max_new_tokens: 8, pairs: ['bf16:bf16', 'minite:minite'], trace: false,
              attribution: false}}
eval: {{profiles: [bf16], tasks: [], num_fewshot: 1, limit: 4, batch_size: 4, max_gen_toks: 12,
       lm_eval: {{gsm8k: {{test: {root / 'gsm8k_test.jsonl'}, train: {root / 'gsm8k_train.jsonl'}}}}}}}
""")
    return exp


def _planned(exp: Path, work: Path) -> dict[str, list[str]]:
    """{rule: [shell command]} of a Snakemake dry run of the experiment (`-p`: the commands it would run)."""
    res = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-p", "all", "--snakefile", str(ROOT / "Snakefile"),
                          "--configfile", str(exp)], cwd=work, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    planned, rule = {}, None
    for line in res.stdout.splitlines():
        if line.startswith("rule ") and line.endswith(":"):
            rule = line[5:-1]
        elif line.startswith("Shell command: ") and rule:
            planned.setdefault(rule, []).append(line[len("Shell command: "):])
    return planned


def _run_in_process(command: str, monkeypatch) -> None:
    """One planned shell command — `[VAR=value ...] minite <args> > log 2>&1` or `python -m <module> <args> ...` —
    run by its entry point in this process (the environment assignments set, the redirection dropped)."""
    words = shlex.split(command.split(" > ")[0])
    while "=" in words[0] and not words[0].startswith("-"):
        key, _, value = words.pop(0).partition("=")
        monkeypatch.setenv(key, value)
    if words[0] == "minite":
        assert cli.main(words[1:]) == 0, command
    else:
        assert words[:2] == ["python", "-m"], command
        module = __import__(words[2], fromlist=["main"])
        assert module.main(words[3:]) in (0, None), command


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("your-model")
    write_checkpoint(root / "model", moe=True)
    exp = _experiment(root)
    work = root / "work"
    work.mkdir()
    (work / "workflow").symlink_to(ROOT / "workflow")  # the DAG reads its schema relative to the working directory
    return root, exp, work


def test_loaded_model_matches_transformers(tiny):
    transformers = pytest.importorskip("transformers")
    root = tiny[0]
    fp32 = PROFILES["bf16"].replace(name="fp32", dtype="float32", router_dtype="float32", lm_head_dtype="float32")
    sut = set_profile(load_pretrained(root / "model"), fp32).eval()
    ref = transformers.AutoModelForCausalLM.from_pretrained(root / "model", dtype=torch.float32).eval()
    ids = torch.randint(0, sut.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (sut(ids) - ref(input_ids=ids).logits.float()).abs().max().item() < 1e-4


def test_experiment_on_your_checkpoint_runs_end_to_end(tiny, monkeypatch):
    root, exp, work = tiny
    planned = _planned(exp, work)
    assert "pretrain" not in planned and set(planned) - SKIPPED == set(STAGES), sorted(planned)
    assert f"--pretrained {root / 'model'}" in planned["rl"][0]  # RL starts from your checkpoint
    assert f"--checkpoint {root / 'model'}" in planned["diagnostics"][0]
    assert f"--train {root / 'train.parquet'}" in planned["data"][0]
    monkeypatch.chdir(work)
    torch.manual_seed(0)
    for rule in STAGES:
        for command in planned[rule]:
            _run_in_process(command, monkeypatch)

    results = work / "results" / "tiny-hf"
    data = read_result(results / "data" / "data.json", stage="data")["metrics"]
    assert data["task"] == "math" and (data["n_train"], data["n_heldout"]) == (40, 10)
    rows = [json.loads(line) for line in (results / "data" / "train.jsonl").read_text().splitlines()]
    assert rows[0]["messages"][0]["role"] == "user" and rows[0]["answer"].isdigit()

    diag = read_result(results / "diagnostics" / "mismatch.json", stage="diagnostics")["metrics"]
    assert set(diag) == {"bf16:bf16", "minite:minite"}
    for m in diag.values():
        assert m["mismatch/tokens"] > 0 and m["mismatch/k3"] >= 0 and m["routing/applies"]

    run = results / "rl" / "minite__minite__none"
    summary = read_result(run / "summary.json", stage="rl")["metrics"]
    assert summary["steps"] == 2 and summary["heldout_n"] == 4
    assert len((run / "metrics.csv").read_text().splitlines()) == 3  # header + 2 steps
    final = load_pretrained(run / "final")
    assert final.config.num_experts == 4 and (run / "final" / "tokenizer.json").is_file()

    ev = read_result(results / "eval" / "minite__minite__none.bf16.json", stage="eval")
    assert ev["n_docs"] == {"gsm8k": 4} and ev["config"]["lm_eval_tasks"]["gsm8k"]["test"].endswith(".jsonl")
    assert 0.0 <= ev["metrics"]["gsm8k/exact_match[strict-match]"] <= 1.0

    report = (results / "report.md").read_text()
    assert "| minite__minite__none | bf16 | 0" in report and "gsm8k exact_match[strict-match]" in report
    assert "miniTE ↔ miniTE" in report and "Your checkpoint: `" in report


# ---- experiments/qwen3-30b-a3b.yaml: the paper's setting needs only its paths --------------------------------
PAPER = ROOT / "experiments" / "qwen3-30b-a3b.yaml"
SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"


def _paths(cfg: dict) -> dict[tuple, str]:
    """{key path: value} of every file or directory the experiment names."""
    out = {("model", "path"): cfg["model"]["path"], ("data", "train"): cfg["data"]["train"],
           ("data", "heldout"): cfg["data"]["heldout"]}
    out.update({("eval", "lm_eval", task, split): f for task, files in cfg["eval"]["lm_eval"].items()
                for split, f in files.items()})
    return out


def _paper_files(root: Path) -> dict[str, Path]:
    """Stand-ins for the paper's files: Qwen3-30B-A3B's config.json and a tokenizer (a dry run reads no weights),
    DAPO-Math-style train rows, MATH-500-style and GSM8K-style rows."""
    from hf_fixture import train_tokenizer

    from minite_core.model import PRESETS

    model = root / "Qwen3-30B-A3B-Base"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(PRESETS["qwen3-30b-a3b"].to_hf()))
    train_tokenizer(["a b c"]).save_pretrained(str(model))
    problems = gsm8k_problems(20)
    math = [{"problem": f"What is {i} + {i}?", "solution": f"$\\boxed{{{2 * i}}}$", "answer": str(2 * i)}
            for i in range(500)]
    return {"model": model, "train": write_parquet(verl_rows(problems, "train"), root / "dapo.parquet"),
            "math": write_jsonl(math, root / "math500.jsonl"), "gsm8k": write_jsonl(problems, root / "gsm8k.jsonl")}


def test_paper_setting_needs_only_its_paths(tmp_path):
    import yaml

    text = PAPER.read_text()
    cfg = yaml.safe_load(text)
    files = _paper_files(tmp_path)
    stand_in = {("model", "path"): files["model"], ("data", "train"): files["train"],
                ("data", "heldout"): files["math"], ("eval", "lm_eval", "minerva_math500", "test"): files["math"]}
    for key, value in _paths(cfg).items():
        text = text.replace(value, str(stand_in.get(key, files["gsm8k"])))  # an edit of the paths, nothing else
    filled = tmp_path / "qwen3-30b-a3b.yaml"
    filled.write_text(text)
    res = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--quiet", "all", "--configfile", str(filled)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert {k: v for k, v in yaml.safe_load(text).items() if k not in ("model", "data", "eval")} == \
        {k: v for k, v in cfg.items() if k not in ("model", "data", "eval")}


def test_paper_setting_names_each_missing_path():
    res = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--quiet", "all", "--configfile", str(PAPER)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "Traceback" not in out
    assert "config: model.path: /data/models/Qwen3-30B-A3B-Base has no config.json" in out


@pytest.mark.parametrize("edit, line", [
    (lambda c: c["data"].update(train=None, heldout=None), "config: data.train / data.heldout: your model trains"),
    (lambda c: c["eval"].update(tasks=["heldout_gen"]), "config: eval.tasks: ['heldout_gen'] score the DAG's own"),
    (lambda c: c["rl"].update(max_new_tokens=0), "config: rl.max_new_tokens: 0 means the longest reference"),
    (lambda c: c["rl"].update(eval_n=11), "config: rl.eval_n: 11 held-out problems per evaluation > the 10"),
    (lambda c: c["eval"]["lm_eval"]["gsm8k"].pop("train"), "config: eval.lm_eval.gsm8k: eval task gsm8k: name its "
                                                            "train split file"),
    (lambda c: c["eval"]["lm_eval"]["gsm8k"].update(test="/nope.jsonl"), "config: eval.lm_eval.gsm8k: eval task "
                                                                          "gsm8k: /nope.jsonl does not exist"),
    (lambda c: c.pop("model"), "config: data.train: your math data needs your model (model.path)"),
])
def test_bad_your_model_config_is_one_line(tiny, edit, line):
    """The Snakefile's checks (schema, its defaults, experiment.semantic_errors), in process: one line each."""
    import yaml
    from snakemake.utils import validate

    from minite_core.experiment import schema_errors, semantic_errors

    cfg = yaml.safe_load(tiny[1].read_text())
    edit(cfg)
    assert schema_errors(cfg, SCHEMA) == []
    validate(cfg, str(SCHEMA))  # fills the defaults, as the Snakefile does
    errors = semantic_errors(cfg)
    assert any(line in e for e in errors) and all("\n" not in e for e in errors), errors
