"""Quantization error of every NVFP4 quantizer variant (the DAG's first stage).

SQNR = 10·log10(‖x‖² / ‖x − x̂‖²) in dB for each combination of block shape (1×16 / 16×16), global scale
(per tensor / per row), arithmetic (exact / fast), rounding (RNE / SR) and RHT (off / on), on Gaussian and
heavy-tailed (Student-t) data. With RHT the error is measured in the rotated basis, which equals the error in
the original basis because the transform is orthogonal. This is the "what does each engine's choice cost in
isolation" table; the mismatch stage measures what the *difference* between two engines' choices costs.
"""
from __future__ import annotations

import argparse
import itertools

import torch

from minite_core.formats.nvfp4 import dequantize, quantize
from minite_core.formats.rht import rht
from minite_core.results import write_result
from minite_core.runs.cli import add_common_args, parse_with_config
from minite_core.seeds import survey_sr_seed

DISTRIBUTIONS = ("gaussian", "student_t3")


def make_data(dist: str, rows: int, cols: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dist == "gaussian":
        return torch.randn(rows, cols, generator=g)
    if dist == "student_t3":  # t = z / sqrt(chi2_3 / 3): heavy tails like LLM activations' outliers
        z = torch.randn(rows, cols, generator=g)
        chi2 = torch.randn(3, rows, cols, generator=g).pow(2).sum(0)
        return z / (chi2 / 3).sqrt()
    raise ValueError(f"unknown distribution {dist!r}; choose one of {DISTRIBUTIONS}")


def sqnr_db(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    err = (x.double() - x_hat.double()).pow(2).sum()
    return float(10 * torch.log10(x.double().pow(2).sum() / err)) if err > 0 else float("inf")


def survey(rows: int = 512, cols: int = 512, seed: int = 0) -> list[dict]:
    out = []
    variants = itertools.product(((1, 16), (16, 16)), ("tensor", "row"), ("exact", "fast"), ("rne", "sr"), (False, True))
    for dist, (block, scale_mode, math, rounding, use_rht) in itertools.product(DISTRIBUTIONS, list(variants)):
        x = make_data(dist, rows, cols, seed)
        x = rht(x) if use_rht else x
        gen = torch.Generator().manual_seed(survey_sr_seed(seed)) if rounding == "sr" else None
        t = quantize(x, block=block, scale_mode=scale_mode, math=math, rounding=rounding, generator=gen)
        out.append({
            "dist": dist, "block": f"{block[0]}x{block[1]}", "scale_mode": scale_mode, "math": math,
            "rounding": rounding, "rht": use_rht, "sqnr_db": round(sqnr_db(x, dequantize(t)), 4),
        })
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="minite quant-error", description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--cols", type=int, default=512, help="multiple of 16")
    ap.add_argument("--out", required=True, help="JSON per the results contract")
    add_common_args(ap, config_help="the experiment's `quant_error:` section as JSON (keys = the flags above)")
    args = parse_with_config(ap, argv)
    if args.rows < 1 or args.cols < 16 or args.cols % 16:
        ap.error(f"--rows must be >= 1 and --cols a positive multiple of 16, got {args.rows} x {args.cols}")
    rows = survey(args.rows, args.cols, args.seed)
    metrics = {f"sqnr_db/{r['dist']}/{r['block']}/{r['scale_mode']}/{r['math']}/{r['rounding']}/rht={int(r['rht'])}": r["sqnr_db"] for r in rows}
    write_result(args.out, stage="quant_error", experiment=args.experiment,
                 config={"rows": args.rows, "cols": args.cols, "seed": args.seed}, metrics=metrics, rows=rows)
    print(f"quant-error: {len(rows)} variants -> {args.out}")
    return 0
