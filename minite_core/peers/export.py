"""`minite export`: write an NVFP4 (compressed-tensors) checkpoint that vLLM loads, from a transformers checkpoint.

    minite export --model DIR --out DIR [--profile vllm-nvfp4] [--calib-jsonl F --tokenizer DIR --calib-rows 64]

The library is `model.nvfp4_io` (export / import, bit-exact); this is its command, a floor up because calibrating
needs the task's tokenizer and data. A model directory without calibrated static activation scales is calibrated
first on `--calib-jsonl` (task JSONL: prompt + response texts) through the path every stage shares
(engines.calibration), so the exported input_global_scale equals what `minite rl` / `minite eval` compute.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from minite_core.engines.calibration import calibrate_on_examples
from minite_core.model import load_pretrained, use_profile
from minite_core.model.nvfp4_io import export_nvfp4
from minite_core.nn import is_calibrated
from minite_core.profiles import get_profile
from minite_core.runs.cli import add_common_args, apply_common_args
from minite_core.task.jsonl import read_jsonl
from minite_core.task.tokenizer import load_tokenizer


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="minite export", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="transformers checkpoint directory (save_pretrained layout)")
    ap.add_argument("--out", required=True, help="output checkpoint directory")
    ap.add_argument("--profile", default="vllm-nvfp4", help="profile whose weight quantizer writes the codes")
    ap.add_argument("--calib-jsonl", default=None, help="task JSONL calibrating static scales (needs --tokenizer)")
    ap.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the model directory's)")
    ap.add_argument("--calib-rows", type=int, default=64, help="calibration examples, chosen by --seed")
    add_common_args(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = apply_common_args(ap, ap.parse_args(argv))
    profile = get_profile(args.profile)
    model = load_pretrained(args.model)
    if args.calib_jsonl:
        tok_dir = args.tokenizer or args.model
        if not (Path(tok_dir) / "tokenizer.json").exists():
            ap.error(f"--calib-jsonl needs a tokenizer: {tok_dir} has no tokenizer.json (pass --tokenizer DIR)")
        with use_profile(model, profile):
            calibrate_on_examples(model, load_tokenizer(tok_dir), read_jsonl(args.calib_jsonl), n=args.calib_rows,
                                  seed=args.seed)
    elif not is_calibrated(model):
        ap.error(f"{args.model} carries no calibrated activation scales: pass --calib-jsonl FILE (e.g. the task's "
                 "train.jsonl) to calibrate before the export")
    out = export_nvfp4(model, args.out, profile=profile)
    print(f"wrote {out}")
    return 0
