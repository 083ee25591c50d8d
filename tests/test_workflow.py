"""The Snakemake DAG: every experiment dry-runs, an invalid config fails naming the key, the Slurm profile
dry-runs, lint is clean. (The smoke DAG itself runs end to end in .ci/run, from a fresh clone as the README's main
command, twice: the second run must do nothing.)"""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from minite_core.experiment import schema_errors
from minite_core.rule_args import launcher

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"


def _dry_run(*args, cwd=ROOT):
    return subprocess.run([*SNAKEMAKE, "-n", "--quiet", "all", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("experiment", ["smoke", "h200", "h200x8"])  # qwen3-30b-a3b: test_your_model.py
def test_experiments_dry_run(experiment):
    res = _dry_run("--configfile", f"experiments/{experiment}.yaml")
    assert res.returncode == 0, res.stderr[-2000:]


@pytest.mark.parametrize(
    "yaml_text, key",
    [
        ("experiment: bad\ndevice: tpu\n", "device"),
        ("experiment: bad\nrl: {steps: 0}\n", "steps"),
        ("experiment: bad\nquant_error: {cols: 100}\n", "cols"),
        ("experiment: bad\ndiagnostics: {pairs: [bf16]}\n", "pairs"),
        ("experiment: bad\ndiagnostics: {budget: {'bf16:bf16': -1}}\n", "budget"),
        ("experiment: bad\nunknown_stage: {}\n", "unknown_stage"),
    ],
)
def test_invalid_config_names_the_key(tmp_path, yaml_text, key):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml_text)
    res = _dry_run("--configfile", str(bad))
    assert res.returncode != 0
    assert key in res.stderr + res.stdout


_BASE = "experiment: bad\n"


@pytest.mark.parametrize(
    "yaml_text, line",
    [  # each class of bad config that used to fail only when its job ran (or printed the whole schema)
        ("rl: {runs: [{learner: bf16, sampler: nope}]}", "config: rl.runs[0].sampler: unknown profile 'nope'"),
        ("rl: {runs: ['vllm-nvfp4:bf16']}", "config: rl.runs[0].learner: profile 'vllm-nvfp4' has no backward"),
        ("diagnostics: {pairs: ['bf16:nope']}", "config: diagnostics.pairs[0]: unknown profile 'nope'"),
        ("diagnostics: {attribution_base: 'nope:bf16'}", "config: diagnostics.attribution_base: unknown profile"),
        ("throughput: {profiles: [bf16, nope]}", "config: throughput.profiles[1]: unknown profile 'nope'"),
        ("throughput: {profiles: [bf16, 'te:nope']}", "config: throughput.profiles[1]: unknown TE mode 'nope'"),
        ("throughput: {profiles: [bf16, 'te:nope+grouped']}", "config: throughput.profiles[1]: unknown TE mode 'nope'"),
        ("throughput: {profiles: [bf16, 'te:bf16+grouped', 'te:nvfp4+grouped']}",
         "config: throughput.profiles[2]: row 'te:nvfp4+grouped': te.GroupedLinear has no path for TE's NVFP4"),
        ("eval: {profiles: [nope]}", "config: eval.profiles[0]: unknown profile 'nope'"),
        ("eval: {runs: [nope__bf16__none]}", "config: eval.runs[0]: 'nope__bf16__none' is not a run of rl.runs"),
        ("quant_error: {rows: 24}", "config: quant_error.rows: 24 is not a multiple of 16"),
        ("rl: {mini_batches: 3}", "config: rl.mini_batches: 3 does not divide"),
        ("pretrain: {num_attention_heads: 4, num_key_value_heads: 3}", "config: pretrain.num_key_value_heads: 3"),
        ("pretrain: {num_experts: 2, num_experts_per_tok: 4}", "config: pretrain.num_experts_per_tok: 4 > "),
        ("data: {n_train_per_level: 9000}", "config: data.n_train_per_level: level add2 has 8100"),
        ("diagnostics: {num_prompts: 600}", "config: diagnostics.num_prompts: 600 > the 512 held-out"),
        ("rl: {eval_n: 600}", "config: rl.eval_n: 600 held-out problems per evaluation > the 512 of the data"),
        ("rl: {runs: ['bf16:bf16', {learner: bf16, sampler: bf16}]}", "config: rl.runs[1]: run bf16__bf16__none is"),
        ("rl: {runs: ['bf16:bf16', {learner: bf16, sampler: bf16, seed: 0}]}", "config: rl.runs[1]: run bf16__bf16__none is"),
        ("throughput: {config: nope.json}", "config: throughput.config: 'nope.json' is neither"),
        ("rl_runs: []", "config: Additional properties are not allowed ('rl_runs' was unexpected)"),
        ("rl: {stepz: 3}", "config: rl: Additional properties are not allowed ('stepz' was unexpected)"),
        ("seed: -1", "config: seed: -1 is less than the minimum of 0"),
        ("gpus_per_job: 3", "config: gpus_per_job: 3 ranks do not split the 4 experts of throughput.config 'tiny'"),
        ("gpus_per_job: 2\nrl: {runs: ['minite:minite']}", "config: gpus_per_job: rl run minite__minite__none on 2 "
         "ranks has 4 rows per rank and mini-batch; its NVFP4 learner needs a multiple of 16"),
        ("device: cuda\ngpus: 3\ngpu_slots: 4", "config: gpu_slots: 4 slots do not split over gpus: 3"),
        ("device: cuda\ngpus: 2\ngpu_slots: 4\nthroughput: {gpus_per_job: 4}",
         "config: throughput.gpus_per_job: 4 GPUs for one job, the machine has gpus: 2"),
        ("diagnostics: {external: [{name: x, path: nope/dump}]}",
         "config: diagnostics.external[0].path: nope/dump does not exist"),
        ("rl: {runs: ['bf16:bf16']}\ndiagnostics: {external: [{name: x, rl_run: nope}]}",
         "config: diagnostics.external[0].rl_run: 'nope' is not a run of rl.runs (bf16__bf16__none)"),
        ("rl: {runs: ['bf16:bf16']}\ndiagnostics: {external: [{name: x, rl_run: bf16__bf16__none}]}",
         "config: diagnostics.external[0].rl_run: the run dumps no rollouts: set rl.rollout_dump_every"),
        ("diagnostics: {external: [{name: x, path: README.md, ceilings: {gen_kl_eror: 1}}]}",
         "config: diagnostics.external[0].ceilings: unknown metric 'gen_kl_eror'"),
        ("diagnostics: {external: [{name: x, path: README.md}, {name: x, path: README.md}]}",
         "config: diagnostics.external[1].name: 'x' names two external logs"),
        ("pretrain: {size: big}", "config: pretrain.size: 'big' is not a size of scale.sizes (none)"),
        ("pretrain: {preset: qwen3-moe-1t}", "config: pretrain.preset: 'qwen3-moe-1t' is not a model preset"),
        ("scale: {sizes: {s: {num_experts: 2, num_experts_per_tok: 4}}}",
         "config: scale.sizes.s.num_experts_per_tok: 4 > num_experts=2"),
        ("scale: {sizes: {s: {hidden_sise: 64}}}", "config: scale.sizes.s: 'hidden_sise' is not one of"),
        ("scale: {sizes: {s: {}}, profiles: [bf16, nope]}", "config: scale.profiles[1]: unknown profile 'nope'"),
        ("scale: {sizes: {s: {}}, eval_n: 600}", "config: scale.eval_n: 600 held-out problems > the 512"),
        ("data: {tokenizer: words}", "config: data.tokenizer: 'words' is not one of ['char', 'bpe']"),
        ("rl: {runs: ['bf16:bf16']}\nholds: {a: ['rl:minite__minite__none']}",
         "config: holds.a: 'rl:minite__minite__none' names no run of rl.runs (bf16__bf16__none)"),
        ("scale: {sizes: {s: {}}}\nholds: {a: ['scale:s'], b: ['scale:s']}",
         "config: holds.b: 'scale:s' is also in hold a"),
        ("holds: {a: [throughputt]}", "config: holds.a: 'throughputt' is neither rl:<run>, scale:<size> nor a rule"),
        ("holds: {a: [eval_checkpoint]}", "config: holds.a: 'eval_checkpoint' has wildcards"),
    ],
)
def test_bad_config_is_one_line_at_parse_time(tmp_path, yaml_text, line):
    bad = tmp_path / "bad.yaml"
    bad.write_text(_BASE + yaml_text + "\n")
    res = _dry_run("--configfile", str(bad))
    out = (res.stdout + res.stderr).strip().splitlines()
    assert res.returncode != 0
    assert any(line in row for row in out), out[-5:]
    assert len(out) <= 3, "a config error must not print the schema or a traceback:\n" + "\n".join(out[:20])


def test_lint_is_clean():
    res = subprocess.run([*SNAKEMAKE, "--lint"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "Congratulations" in res.stdout + res.stderr, (res.stdout + res.stderr)[-3000:]


def test_slurm_profile_dry_run():
    pytest.importorskip("snakemake_executor_plugin_slurm", reason="optional extra `slurm` not installed")
    res = _dry_run("--workflow-profile", "workflow/profiles/slurm", "--configfile", "experiments/h200.yaml")
    assert res.returncode == 0, res.stderr[-2000:]


def _dry_run_commands(tmp_path, yaml_text, *args):
    cfg = tmp_path / "multi.yaml"
    cfg.write_text(yaml_text)
    res = subprocess.run([*SNAKEMAKE, "-n", "-p", "all", "--configfile", str(cfg), *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def test_multi_gpu_experiment_launches_torchrun(tmp_path):
    """gpus_per_job > 1: the throughput bench and every RL run start under torchrun (bench.learner_dist,
    rl/distributed.py) and the RL jobs claim the local GPU pool; 1 (the default): plainly; 0: the one-line schema
    error. (16 prompts x 4 / 2 mini-batches / 2 ranks = 16 rows a rank: what minite's NVFP4 wgrad needs.)"""
    out = _dry_run_commands(tmp_path, "experiment: multi-gpus\ngpus_per_job: 2\n"
                                      "rl: {prompts_per_step: 16, runs: ['bf16:bf16', 'minite:minite']}\n")
    commands = [line for line in out.splitlines() if "torchrun --standalone" in line]
    assert any("--nproc-per-node 2 -m minite_core.cli bench learner --out" in c for c in commands)
    rl = [c for c in commands if "-m minite_core.cli rl --pretrained" in c]
    assert len(rl) == 2 and all("--nproc-per-node 2" in c for c in rl), commands
    assert len(commands) == 3, "the throughput bench and the two RL runs, nothing else"
    job = out[out.index("rule rl:"):]
    assert "gpu=4" in job[:job.index("\n\n")]  # every local slot: torchrun holds the node's GPUs
    plain = _dry_run_commands(tmp_path, "experiment: multi-onegpu\nrl: {runs: ['bf16:bf16']}\n")
    assert "Shell command: minite rl --pretrained" in plain and "torchrun --standalone" not in plain
    assert launcher({"gpus_per_job": 1}, "rl") == "minite" and launcher({}, "throughput") == "minite"
    assert schema_errors({"experiment": "x", "gpus_per_job": 0}, SCHEMA) == [
        "config: gpus_per_job: 0 is less than the minimum of 1"]


def test_node_experiment_spreads_one_gpu_jobs_and_runs_the_bench_on_all(tmp_path):
    """experiments/h200x8.yaml: the throughput bench under torchrun on the node's 8 GPUs without the
    plain baseline (the full-depth model does not fit one GPU); every other command that computes takes one GPU of
    8 (`--gpu-lease 8x2`), the RL runs included (rl.gpus_per_job unset: the top-level 1)."""
    res = subprocess.run([*SNAKEMAKE, "-n", "-p", "all", "--configfile", "experiments/h200x8.yaml"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    commands = [line for line in res.stdout.splitlines() if line.startswith("Shell command: ")]
    bench = [c for c in commands if "bench learner" in c]
    assert len(bench) == 1 and "torchrun --standalone --nproc-per-node 8 -m minite_core.cli bench learner" in bench[0]
    assert '"compare_plain": false' in bench[0] and '"gpus_per_job"' not in bench[0]
    rl = [c for c in commands if " rl --pretrained" in c]
    assert len(rl) == 8 and all(c.startswith("Shell command: minite rl") and "--gpu-lease 8x2" in c for c in rl)
    computing = [c for c in commands if "--device cuda" in c]
    assert all("--gpu-lease 8x2" in c for c in computing) and len(computing) > len(rl) + 1


def test_slurm_profile_places_a_multi_gpu_job_on_one_node(tmp_path):
    """The throughput job asks Slurm for gpus_per_job GPUs (`gres`, which the plugin turns into --gres=gpu:4) on one
    node, and not for the local GPU slots (`gpu` 0: the plugin would add --gpus=<slots>)."""
    pytest.importorskip("snakemake_executor_plugin_slurm", reason="optional extra `slurm` not installed")
    out = _dry_run_commands(tmp_path, "experiment: multi-slurm\ndevice: cuda\ngpus_per_job: 4\n",
                            "--workflow-profile", "workflow/profiles/slurm")
    job = out[out.index("rule throughput:"):]
    job = job[:job.index("\n\n")]
    assert "gpu=0, gres=gpu:4, nodes=1, slurm_extra=--exclusive" in job
    assert "torchrun --standalone --nproc-per-node 4" in job


def test_ci_runs_both_readme_commands():
    """.ci/run extracts the README's main and test commands, runs each in a fresh clone, checks report.md and a
    no-op second DAG run (bash -n: the script at least parses)."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert "readme_block main-command" in ci and "readme_block test-command" in ci
    assert "results/smoke/report.md" in ci and "Nothing to be done" in ci and "git clone" in ci
    assert subprocess.run(["bash", "-n", str(ROOT / ".ci" / "run")]).returncode == 0


def test_rl_run_seeds_name_the_runs():
    """A run seed other than the experiment's adds __s<seed>: the seeds of one pair get distinct directories."""
    from minite_core.experiment import rl_runs

    entries = ["bf16:bf16", {"learner": "bf16", "sampler": "bf16", "seed": 1},
               {"learner": "minite", "sampler": "minite", "seed": 2, "correction": "tis"}]
    runs = rl_runs({"seed": 2, "rl": {"runs": entries}})
    assert list(runs) == ["bf16__bf16__none", "bf16__bf16__none__s1", "minite__minite__tis"]
    assert [r["seed"] for r in runs.values()] == [2, 1, 2]


def test_sweep_files_load():
    from minite_core.sweep import load_sweep, points

    for path in sorted((ROOT / "experiments" / "sweeps").glob("*.yaml")):
        assert points(load_sweep(path)), path


def test_h200_experiment_is_what_issue_20_asks():
    """>= 32 experts, >= 300 steps, the four pairs + TIS and MIS on the naive pair, >= 2 seeds for bf16 and
    minite, held-out on >= 512 problems at every evaluation, lm-eval with the same n."""
    import yaml

    from minite_core.experiment import pretrain_section, rl_runs

    cfg = yaml.safe_load((ROOT / "experiments" / "h200.yaml").read_text())
    assert pretrain_section(cfg)["num_experts"] >= 32 and cfg["rl"]["steps"] >= 300
    runs = rl_runs(cfg).values()
    pairs = {(r["learner"], r["sampler"], r["correction"]) for r in runs}
    assert {("bf16", "bf16", "none"), ("te-nvfp4", "vllm-nvfp4", "none"), ("te-nvfp4", "vllm-marlin-w4a16", "none"),
            ("minite", "minite", "none"), ("te-nvfp4", "vllm-nvfp4", "tis")} <= pairs
    assert any(c.startswith("mis") for learner, _, c in pairs if learner == "te-nvfp4")
    for learner in ("bf16", "minite"):
        assert len({r["seed"] for r in runs if r["learner"] == learner and r["correction"] == "none"}) >= 2
    n = cfg["rl"]["eval_n"]
    assert n >= 512 and cfg["data"]["n_heldout_per_level"] * len(cfg["data"]["levels"]) >= n
    assert cfg["eval"]["limit"] == n


def test_h200_experiment_is_what_issue_38_asks():
    """>= 4 sizes from the 13 M model to >= 0.8 B parameters, all measured on the same 512 problems under bf16,
    minite, te-nvfp4 and vllm-nvfp4; RL on a size of >= 0.5 B parameters with a BPE tokenizer; R3 and the on-policy
    pair among the runs; holds that compute every run, size, benchmark and the diagnostics, each run and size once."""
    import torch
    import yaml

    from minite_core.experiment import pretrain_section, rl_runs, scale_sizes
    from minite_core.model import CausalLM
    from minite_core.rl.pretrain import PretrainConfig
    from minite_core.rl.scale import ScaleConfig

    cfg = yaml.safe_load((ROOT / "experiments" / "h200.yaml").read_text())

    def params(section):
        with torch.device("meta"):
            return CausalLM(PretrainConfig(**section).model_config()).num_parameters()

    sizes = {name: params(pretrain_section(cfg, name)) for name in scale_sizes(cfg)}
    assert len(sizes) >= 4 and min(sizes.values()) == 13_306_368 and max(sizes.values()) >= 0.8e9
    assert cfg["pretrain"]["size"] in sizes and sizes[cfg["pretrain"]["size"]] >= 0.5e9
    assert set(ScaleConfig().profiles) == {"bf16", "minite", "te-nvfp4", "vllm-nvfp4"} and cfg["scale"]["eval_n"] == 512
    assert cfg["data"]["tokenizer"] == "bpe"
    pairs = {(r["learner"], r["sampler"]) for r in rl_runs(cfg).values()}
    assert {("te-nvfp4-r3", "vllm-nvfp4"), ("minite-onpolicy", "minite-onpolicy")} <= pairs
    items = [item for hold in cfg["holds"].values() for item in hold]
    assert sorted(i for i in items if i.startswith("rl:")) == sorted(f"rl:{r}" for r in rl_runs(cfg))
    assert sorted(i for i in items if i.startswith("scale:")) == sorted(f"scale:{s}" for s in sizes)
    assert {"kernels_check", "quant_error", "throughput", "throughput_sampler", "diagnostics"} <= set(items)
    for hold in cfg["holds"].values():  # claim (c) readable within each RL hold
        runs = {i.split(":")[1].split("__")[0] for i in hold if i.startswith("rl:")}
        assert not runs or {"bf16", "minite", "te-nvfp4"} <= runs


def test_h200_benches_measure_every_target():
    """The H200 benches time what their targets read: every NVFP4 sampler profile, cached and packed, on the
    RL base model's shape too (the MoE decode target), and each row's kernels (the learner's quantize share)."""
    import yaml

    from minite_core.bench.sampler import NVFP4, PACKED

    cfg = yaml.safe_load((ROOT / "experiments" / "h200.yaml").read_text())
    sampler = cfg["sampler_bench"]
    assert set(NVFP4 + PACKED) <= set(sampler["profiles"]) and sampler["profiles"][0] == "bf16"
    assert {"rl", "weight-bound", "model"} <= set(sampler["shapes"])
    assert sampler["op_profile"] and cfg["throughput"]["op_profile"]
    res = subprocess.run([*SNAKEMAKE, "-n", "-p", "--forcerun", "throughput_sampler", "--configfile",
                          "experiments/h200.yaml", "--", "throughput_sampler"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "minite bench sampler --out results/h200/throughput/sampler.json --model results/h200/pretrain/model" \
        in res.stdout


def test_holds_dry_run_name_their_jobs(tmp_path):
    """`snakemake hold_<name>`: a hold runs what it names and what that needs (data, kernels check, base model),
    nothing else; the RL base model's size is SFT'd by the pretrain rule, the other sizes by scale_pretrain."""
    cfg = tmp_path / "holds.yaml"
    cfg.write_text("experiment: holdstest\ndata: {tokenizer: bpe}\npretrain: {size: b}\n"
                   "scale: {sizes: {a: {hidden_size: 32}, b: {hidden_size: 48}}}\n"
                   "rl: {runs: ['bf16:bf16', 'minite-onpolicy:minite-onpolicy']}\n"
                   "holds: {sweep: ['scale:a', 'scale:b'], onpolicy: ['rl:minite-onpolicy__minite-onpolicy__none']}\n")

    def jobs(target):
        res = subprocess.run([*SNAKEMAKE, "-n", "-p", target, "--configfile", str(cfg)], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
        return sorted(re.findall(r"^(?:local)?rule (\w+):", res.stdout, flags=re.M)), res.stdout

    names, out = jobs("hold_sweep")
    assert names == ["data", "hold_sweep", "kernels_check", "pretrain", "scale_measure", "scale_measure",
                     "scale_pretrain"]
    assert "minite scale --checkpoint results/holdstest/pretrain/model" in out
    assert "minite scale --checkpoint results/holdstest/scale/a/model" in out
    assert '"hidden_size": 48' in out.split("rule pretrain:")[1].split("\n\n")[0]
    names, _ = jobs("hold_onpolicy")
    assert names == ["data", "eval_checkpoint", "eval_checkpoint", "hold_onpolicy", "kernels_check", "pretrain", "rl"]


@pytest.mark.parametrize("script", sorted((ROOT / "workflow" / "scripts").glob("*.sh")), ids=lambda p: p.name)
def test_shell_scripts_parse(script):
    """`bash -n` on every script the H200 calls run (an apostrophe in a `${VAR:?message}` once broke three)."""
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
