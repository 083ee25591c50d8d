# Stage: execution diagnostics — learner<->sampler mismatch of every profile pair on one checkpoint,
# first-divergence trace, one-knob attribution (minite_core.diagnostics; `minite diagnose`).
#
# Config (experiments/*.yaml, key `diagnostics`):
#   checkpoint        path of the checkpoint dir to measure (the pretrained base model by default; see
#                     diagnostics_checkpoint below to chain it to the upstream rule instead)
#   pairs             ["learner:sampler", ...]        e.g. the four of DESIGN.md
#   num_prompts, max_new_tokens, temperature, top_p, num_calib, batch_size (null = all rows in one batch)
#   prompts, calib    task JSONL paths or null (null = the DAG's held-out / train split)
#   trace, attribution  booleans;  attribution_base "learner:sampler"
#   budget            {"learner:sampler": k3 ceiling}: the gate (fails the rule naming pair, k3, budget, first op)
# plus the top-level `seed` and `device`.


def diagnostics_checkpoint(wildcards):
    """The checkpoint measured: config diagnostics.checkpoint, else the DAG's pretrained base model."""
    return config["diagnostics"].get("checkpoint") or rules.pretrain.output.checkpoint


def _diagnostics_jsonl(key, default):
    """Prompts (held-out split) and calibration data (train split: never the measured prompts) default to the
    DAG's task data; config diagnostics.prompts / .calib override with a path."""
    def inner(wildcards):
        return [config["diagnostics"].get(key) or default]
    return inner


def _diagnostics_flags(wildcards, input):
    d = config["diagnostics"]
    flags = []
    if input.prompts:
        flags.append(f"--prompts {input.prompts[0]}")
    if input.calib:
        flags.append(f"--calib {input.calib[0]}")
    if d.get("batch_size"):
        flags.append(f"--batch-size {d['batch_size']}")
    if d.get("trace", True):
        flags.append("--trace")
    if d.get("attribution", True):
        flags.append(f"--attribution --attribution-base {d.get('attribution_base', 'te-nvfp4:vllm-nvfp4')}")
        if d.get("attribution_cumulative", True):
            flags.append("--attribution-cumulative")
    flags += [f"--k3-budget {pair}={value}" for pair, value in d.get("budget", {}).items()]
    return " ".join(flags)


rule diagnostics:
    input:
        checkpoint=diagnostics_checkpoint,
        prompts=_diagnostics_jsonl("prompts", rules.data.output.heldout),
        calib=_diagnostics_jsonl("calib", rules.data.output.train),
    output:
        json=f"{RESULTS}/diagnostics/mismatch.json",
        figures=report(directory(f"{RESULTS}/diagnostics/figures"), patterns=["{name}.png"],
                       caption="../report/diagnostics.rst", category="Diagnostics"),
    log:
        f"{RESULTS}/logs/diagnostics.log",
    benchmark:
        f"{RESULTS}/benchmarks/diagnostics.tsv"
    resources:
        gpu=1 if config.get("device", "cpu") == "cuda" else 0,
    params:
        pairs=lambda wildcards: ",".join(cfg("diagnostics", "pairs")),
        num_prompts=cfg("diagnostics", "num_prompts"),
        max_new_tokens=cfg("diagnostics", "max_new_tokens"),
        temperature=cfg("diagnostics", "temperature"),
        top_p=config["diagnostics"].get("top_p", 1.0),
        num_calib=config["diagnostics"].get("num_calib", 16),
        seed=cfg("seed"),
        device=config.get("device", "cpu"),
        flags=_diagnostics_flags,
    shell:
        KERNELS_ENV + "minite diagnose --checkpoint {input.checkpoint} --pairs {params.pairs} "
        "--num-prompts {params.num_prompts} --max-new-tokens {params.max_new_tokens} "
        "--temperature {params.temperature} --top-p {params.top_p} --num-calib {params.num_calib} "
        "--seed {params.seed} --device {params.device} {params.flags} "
        "--experiment {EXP} --out {output.json} --figures {output.figures} > {log} 2>&1"
