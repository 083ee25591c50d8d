"""The learner throughput section's kernel tables (report/tables.kernel_tables) from a made-up
throughput/learner.json: rendered where the bench ran with `--op-profile`, profiler annotation ranges such as
`Optimizer.step#AdamW.step` left out of the tables and the totals, and the section unchanged without `op_profile`."""
from __future__ import annotations

import json

from minite_core.report.build import build, section_throughput
from minite_core.report.tables import REPORT_NOTE, is_annotation, throughput_table

LAMBDA = ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
          "::{lambda()#3}:")  # a real kernel name (H200 learner profile)


def _learner(op_profile: dict | None) -> dict:
    """The smallest throughput/v1 learner payload that throughput_table reads: one bf16 row of 9.5 ms."""
    model = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
             "vocab_size": 256}
    config = {"model_config": model, "num_parameters": 1e6, "param_dtype": "float32", "optimizer": "AdamW(fused)",
              "batch": 2, "seq": 8, "tokens_per_step": 16, "iters_run": 3, "warmup": 1}
    row = {"profile": "bf16", "tokens_per_s": 1684.0, "p20_tokens_per_s": 1600.0, "p80_tokens_per_s": 1700.0,
           "mfu": None, "step_ms": 9.5, "speedup_vs_bf16": 1.0, "speedup_vs_te_nvfp4": None, "peak_mem_gb": None,
           "saved_act_gb": 0.01, "saved_act_ratio_vs_bf16": 1.0}
    paper = {"hardware": "B300", "model": "Qwen3-30B-A3B", "source": "paper", "minite_tokens_per_s": 33540,
             "speedup_vs_bf16": 1.39, "speedup_vs_te_nvfp4": 1.47}
    return {"schema": "throughput/v1", "experiment": "t", "config": config, "env": {"gpu": "H200"}, "rows": [row],
            "skipped": [], "targets": {}, "paper": paper, **({"op_profile": op_profile} if op_profile else {})}


def _op_profile() -> dict:
    """bf16: 9 entries of which one is the optimizer's annotation range (1 call, 2 ms) over its kernel (2 ms)."""
    top = [{"kernel": "_grouped_kernel", "calls_per_step": 4.0, "ms_per_step": 3.0},
           {"kernel": "Optimizer.step#AdamW.step", "calls_per_step": 1.0, "ms_per_step": 2.0},
           {"kernel": "multi_tensor_apply_kernel", "calls_per_step": 1.0, "ms_per_step": 2.0},
           {"kernel": LAMBDA, "calls_per_step": 2.0, "ms_per_step": 1.0}]
    top += [{"kernel": f"small_kernel_{i}", "calls_per_step": 1.0, "ms_per_step": 0.25} for i in range(8)]
    launched = [top[0], top[3], top[1]]  # most calls first; the annotation range is left out of the line
    return {"bf16": {"steps": 1, "kernels_per_step": 16.0, "kernel_ms_per_step": 10.0, "top": top,
                     "most_launched": launched}}


def test_annotation_ranges_are_not_kernels():
    assert is_annotation("Optimizer.step#AdamW.step") and is_annotation("Optimizer.zero_grad#AdamW.zero_grad")
    assert not is_annotation(LAMBDA)  # a '#' inside a kernel's name
    assert not is_annotation("_quantize_kernel") and not is_annotation("nvjet_sm90_tss_64x8_64x16_1x4_h_bz_TNT")


def test_learner_section_renders_the_kernel_table(tmp_path):
    (tmp_path / "throughput").mkdir()
    (tmp_path / "throughput" / "learner.json").write_text(json.dumps(_learner(_op_profile())))
    text = section_throughput(tmp_path)
    kernels = text[text.index("### Kernels of one learner update"):]
    # totals without the annotation range: 16 - 1 kernels, 10 - 2 ms, below the timed 9.5 ms step
    assert "**bf16**: 15 kernels, 8.0 ms of kernels per step (timed step 9.5 ms, 84% of it in kernels; 2.0 ms of " \
           "annotation ranges left out)." in kernels
    assert "Most launched: `_grouped_kernel` x4, `unrolled_elementwise_kernel<direct_copy_kernel_…` x2." \
        in kernels
    rows = [line for line in kernels.splitlines() if line.startswith("| `")]
    assert len(rows) == 8  # the top 8 kernels
    assert rows[0] == "| `_grouped_kernel` | 4 | 3.0 | 37.5 |"  # % of the 8.0 kernel ms
    assert rows[1].startswith("| `multi_tensor_apply_kernel` |")
    assert not any("Optimizer.step" in r for r in rows) and "`Optimizer.step#AdamW.step`" in kernels  # caption
    assert rows[2].startswith("| `unrolled_elementwise_kernel<direct_copy_kernel_cuda(") and "…` |" in rows[2]
    assert "| `small_kernel_4` | 1 | 0.250 | 3.1 |" in kernels and "small_kernel_5" not in kernels
    assert "### Kernels of one learner update" in build(tmp_path)


def test_learner_section_unchanged_without_op_profile(tmp_path):
    (tmp_path / "throughput").mkdir()
    res = _learner(None)
    (tmp_path / "throughput" / "learner.json").write_text(json.dumps(res))
    text = section_throughput(tmp_path)
    assert "Kernels of one" not in text
    assert text == "## Learner-update throughput: BF16 vs TE-NVFP4 vs miniTE\n\n" + REPORT_NOTE + "\n" \
        + throughput_table(res)


def _kernels(ms: float, launches: int, top: list[tuple[str, float]], **groups) -> dict:
    return {"batch": 1, "kernels_per_step": launches, "kernel_ms_per_step": ms,
            "top": [{"kernel": k, "calls_per_step": 1, "ms_per_step": v} for k, v in top],
            **({"group_ms_per_step": groups} if groups else {})}


def test_missed_learner_target_names_its_measured_limit():
    """miniTE 0.60× BF16 with 70 of its 300 kernel ms in quantize passes: the rest (230 ms) alone exceeds the
    0.80× target's 225 ms, so the line says the quantize passes are not the limit; a met target has no line."""
    res = _learner({"bf16": _kernels(180.0, 1500, [("gemm", 120.0)]),
                    "minite": _kernels(300.0, 2700, [("_quantize_kernel", 40.0), ("gemm", 130.0)], quantize=70.0)})
    check = {"target": "miniTE ≥ 0.80× BF16 tokens/s (aim 0.90×)", "value": 0.6, "met": False}
    res["targets"] = {"applicable": True, "checks": [check]}
    text = throughput_table(res)
    assert "The target allows 225.0 ms" in text and "70.0 ms separate quantize passes + 230.0 ms the rest" in text
    assert "not the quantize passes, are the limit" in text
    res["op_profile"]["minite"]["group_ms_per_step"]["quantize"] = 80.0  # rest 220 ms: fusing would do it
    assert "fused away the rest (220.0 ms) fits it" in throughput_table(res)
    check["met"] = True
    assert "Measured limit" not in throughput_table(res)


def test_missed_sampler_target_names_its_measured_limit():
    """Weight-bound batch 1, packed 2× target: bf16 1.8 ms of kernels, packed 1.1 ms = 0.55 ms GEMMs + 0.55 ms
    rest; the target allows 0.9 ms, so the GEMMs would need 0.35 ms (1.57× faster), above their copy time."""
    from minite_core.report.tables import sampler_table

    rows = [{"profile": p, "shape": "weight-bound", "batch": 1, "engine": "fast", "tokens_per_s": v,
             "p20_tokens_per_s": v, "p80_tokens_per_s": v, "step_ms": 1e3 / v, "speedup_vs_bf16": v / 550.0,
             "weight_bytes_per_step": b} for p, v, b in [("bf16", 550.0, 3.4e9), ("minite-packed", 800.0, 1.1e9)]]
    check = {"target": "weight-bound batch 1: minite-packed >= 2.0x bf16", "value": 1.45, "met": False}
    res = {"config": {"prompt_len": 32, "new_tokens": 128, "reps": 5}, "env": {"gpu": "H200"}, "rows": rows,
           "ceilings": {"copy_gbps": 4000.0}, "targets": {"applicable": True, "checks": [check]},
           "op_profile": {"weight-bound/bf16": _kernels(1.8, 330, [("nvjet", 1.2)]),
                          "weight-bound/minite-packed": _kernels(1.1, 270, [("nvfp4_decode_mma<1>", 0.55)])}}
    text = sampler_table(res)
    assert "0.550 ms packed GEMMs + 0.550 ms the rest" in text and "The target allows 0.900 ms" in text
    assert "the packed GEMMs in ≤ 0.350 ms, 1.57× faster than measured" in text
    assert "the packed weights take 0.225 ms at the copy bandwidth" in text  # 2.3e9 · 0.5625 / 1.4375 / 4e12
    res["op_profile"]["weight-bound/minite-packed"]["top"][0]["ms_per_step"] = 0.2  # rest 0.9 ms: no room left
    assert "these, not the GEMMs, are the limit" in sampler_table(res)


def test_missed_bandwidth_target_names_the_gemms_share():
    """bf16 at the weight-bound shape, batch 1: 3.2 GB of weights in 1.0 ms of cuBLAS GEMMs is 3,200 GB/s, 80% of a
    4,000 GB/s copy; a 1.6 ms step misses 70% (1.14 ms allowed) by the rest and the gaps between kernels."""
    from minite_core.report.tables import sampler_table

    row = {"profile": "bf16", "shape": "weight-bound", "batch": 1, "engine": "fast", "tokens_per_s": 625.0,
           "p20_tokens_per_s": 625.0, "p80_tokens_per_s": 625.0, "step_ms": 1.6, "speedup_vs_bf16": 1.0,
           "weight_bytes_per_step": 3.2e9, "kv_bytes_per_step": 0.0}
    check = {"target": "weight-bound batch 1: bf16 >= 70% of copy bandwidth", "value": 0.5, "met": False}
    res = {"config": {"prompt_len": 32, "new_tokens": 128, "reps": 5}, "env": {"gpu": "H200"}, "rows": [row],
           "ceilings": {"copy_gbps": 4000.0}, "targets": {"applicable": True, "checks": [check]},
           "op_profile": {"weight-bound/bf16": _kernels(1.4, 330, [("nvjet_sm90_tst", 0.9), ("splitKreduce", 0.1)])}}
    text = sampler_table(res)
    assert "1.0 ms cuBLAS GEMMs (the weights at 3,200 GB/s, 80% of copy) + 0.400 ms the rest" in text
    assert "the target allows 1.1 ms a step" in text and "(0.600 ms) are what is over" in text


def test_decode_gemm_target_reads_the_fastest_packed_op():
    """M <= 16, N = K >= 4096 only; the fastest packed op of the shape; a miss says what bandwidth 2.5× needs."""
    from minite_core.report.tables import decode_gemm_target

    def row(op, shape, speedup, bw):
        return {"op": op, "shape": shape, "time_ms": 0.01, "speedup": speedup, "bw_frac": bw}
    rows = [row("decode-bf16-cublas", "M1 N8192 K8192", None, 0.9), row("decode-w4a16-mma", "M1 N8192 K8192", 2.0, 0.5),
            row("decode-w4a4-mma", "M1 N8192 K8192", 1.5, 0.4), row("decode-bf16-cublas", "M1 N4096 K4096", None, 0.6),
            row("decode-w4a16-mma", "M1 N4096 K4096", 2.6, 0.45), row("decode-bf16-cublas", "M32 N8192 K8192", None, 0.9),
            row("decode-w4a16-mma", "M32 N8192 K8192", 1.0, 0.3)]
    text = decode_gemm_target(rows)
    assert "- M1 N8192 K8192: `decode-w4a16-mma` 2.00× (**missed**); it streams its bytes at 50% of the copy " \
           "bandwidth, cuBLAS at 90%: 2.5× needs 62%" in text
    assert "- M1 N4096 K4096: `decode-w4a16-mma` 2.60× (met)" in text and "M32" not in text
    assert decode_gemm_target([]) == ""
