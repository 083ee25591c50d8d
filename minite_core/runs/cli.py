"""What every `minite <command>` shares: the run options, how a rule's config reaches a command, one-line errors.

Run options (`add_common_args`): --seed, --experiment, --device, --kernels, --sampler-engine, --threads,
--gpu-lease, --config-json. Every rule passes its config section the same way, as `--config-json '<JSON>'`:
commands whose config is a frozen dataclass (`data`, `pretrain`, `rl`) build it with `results.config_from_json`;
commands with one flag per option (`diagnose`, `eval`, `quant-error`, `bench learner`) read it with
`parse_with_config`, which turns each key into the default of the flag of the same name (`num_prompts` ->
`--num-prompts`, `spec` -> `--spec-json`), so flags given on the command line still win and an unknown key is an
error naming it.

`--gpu-lease GxS` (the DAG's, with `gpus: G` in the experiment) gives the command one of the machine's G GPUs
(runs/gpu_lease.py). `--kernels` and `--sampler-engine` (with their environment overrides) resolve into the
command's one `Execution` (runs/execution.py), installed for the process, recorded in every result's `env` and
left on `args.execution` for the command to pass down; `--device cuda` without a GPU fails at once.

Errors (`run_command`): a command that raises prints `minite <command>: error: <message>` on one line and exits 1
(argparse's own usage errors exit 2); `--debug` anywhere on the command line or `MINITE_DEBUG=1` shows the
traceback instead. The message is the exception's, which names the input and what to do (the library raises
ValueError / FileNotFoundError with such messages).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

import torch

from minite_core.results import config_from_json
from minite_core.runs.execution import ENGINE_CHOICES, KERNEL_CHOICES, Execution


def add_common_args(parser: argparse.ArgumentParser, *, config_help: str | None = None) -> None:
    """The run options of every stage command (module docstring)."""
    parser.add_argument("--seed", type=int, default=0, help="run seed; every draw derives from it (seeds.py)")
    parser.add_argument("--experiment", default="adhoc", help="experiment name recorded in the result")
    parser.add_argument("--device", default="cpu", help="cpu | cuda")
    parser.add_argument("--kernels", default="auto", choices=KERNEL_CHOICES,
                        help="kernel backend (auto: $MINITE_KERNELS, else native on sm_100+, triton on other GPUs, "
                             "reference on CPU)")
    parser.add_argument("--sampler-engine", default="auto", choices=ENGINE_CHOICES,
                        help="rollout engine (auto: $MINITE_SAMPLER, else the fast CUDA-graph sampler on the GPU, "
                             "the reference on CPU)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (Snakemake's {threads})")
    parser.add_argument("--gpu-lease", default=None, metavar="GxS",
                        help="with --device cuda: take one of G GPUs (S jobs a GPU) before CUDA starts")
    parser.add_argument("--config-json", default="{}", help=config_help or "this stage's config section as JSON")


def add_run_args(parser: argparse.ArgumentParser, config_help: str) -> None:
    """`add_common_args` + what resumable runs (`minite pretrain`, `minite rl`) add."""
    add_common_args(parser, config_help=config_help)
    parser.add_argument("--state", default=None, help="resume-state directory (default: <out>/state)")
    parser.add_argument("--restart", action="store_true",
                        help="start the run over; the run already in --out is kept under <out>/previous/<time>/")
    parser.add_argument("--restart-if-changed", action="store_true",
                        help="a run of another config in --out is kept under <out>/previous/<time>/ and this one "
                             "starts over (else that is an error); a run of this config resumes")
    parser.add_argument("--no-progress", action="store_true")


def apply_common_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Act on the run options: threads, device check, the execution (args.execution, recorded in every result's
    env)."""
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        parser.error(f"--device must be cpu or cuda[:N], got {args.device!r}")
    if args.gpu_lease and args.device.startswith("cuda"):  # before anything asks CUDA about its devices
        from minite_core.runs import gpu_lease

        try:
            gpu_lease.lease(args.gpu_lease)
        except ValueError as e:
            parser.error(str(e))
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA GPU is visible here; use --device cpu")
    try:
        args.execution = Execution.resolve(device=args.device, kernels=args.kernels,
                                           sampler_engine=args.sampler_engine).install()
    except ValueError as e:
        parser.error(str(e))
    return args


def parse_run_args(parser, argv, config_cls):
    """-> (args, config): parse, apply the run options, build the frozen config from --config-json."""
    args = apply_common_args(parser, parser.parse_args(argv))
    try:
        return args, config_from_json(config_cls, args.config_json)
    except (ValueError, TypeError) as e:
        parser.error(f"--config-json: {e}")


def parse_with_config(parser: argparse.ArgumentParser, argv) -> argparse.Namespace:
    """Parse argv with `--config-json` keys as flag defaults (module docstring), then apply the run options."""
    pre, _ = parser.parse_known_args(argv)
    try:
        section = json.loads(pre.config_json or "{}")
    except json.JSONDecodeError as e:
        parser.error(f"--config-json is not JSON: {e}")
    if not isinstance(section, dict):
        parser.error(f"--config-json must be a JSON object, got {type(section).__name__}")
    by_option = {opt: action for action in parser._actions for opt in action.option_strings}
    defaults = {}
    for key, value in section.items():
        flag = "--" + key.replace("_", "-")
        action = by_option.get(flag)
        if action is None and (flag + "-json") in by_option:
            action, value = by_option[flag + "-json"], json.dumps(value)
        if action is None or action.dest in ("config_json", "help"):
            known = sorted(o[2:].replace("-", "_") for o in by_option if o.startswith("--"))
            parser.error(f"--config-json: unknown key {key!r}; known: {', '.join(known)}")
        if isinstance(value, list):
            value = ",".join(map(str, value))
        defaults[action.dest] = value
    parser.set_defaults(**defaults)
    return apply_common_args(parser, parser.parse_args(argv))


def dispatch(argv: list[str], commands: dict[str, tuple[str, str]], prog: str, noun: str = "command") -> int:
    """Run `commands[argv[0]]`'s module `main(argv[1:])` with one-line errors; help / unknown names list them."""
    if not argv or argv[0] in ("-h", "--help"):
        width = max(map(len, commands))
        lines = [f"  {name:<{width}}  {help_}" for name, (_, help_) in commands.items()]
        print(f"usage: {prog} <{noun}> [args...] [--debug]\n\n{noun}s:\n" + "\n".join(lines))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in commands:
        print(f"{prog}: error: unknown {noun} {name!r}; choose one of {', '.join(commands)}", file=sys.stderr)
        return 2
    return run_command(f"{prog} {name}", lambda: importlib.import_module(commands[name][0]).main(rest))


def debug_enabled(argv: list[str]) -> tuple[bool, list[str]]:
    """(--debug given or MINITE_DEBUG=1, argv without --debug)."""
    rest = [a for a in argv if a != "--debug"]
    return len(rest) != len(argv) or os.environ.get("MINITE_DEBUG", "") not in ("", "0"), rest


def one_line(exc: BaseException) -> str:
    """The exception as one line: its message with whitespace runs collapsed (type name when it has none)."""
    text = " ".join(str(exc).split())
    if isinstance(exc, (KeyError, FileNotFoundError, PermissionError, IsADirectoryError)) or not text:
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text


def run_command(prog: str, fn) -> int:
    """fn() -> exit code; an exception becomes `prog: error: <one line>` (exit 1) unless debugging."""
    if os.environ.get("MINITE_DEBUG", "") not in ("", "0"):
        return fn() or 0
    try:
        return fn() or 0
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the CLI boundary: every error becomes one line (--debug: traceback)
        print(f"{prog}: error: {one_line(exc)} (--debug shows the traceback)", file=sys.stderr)
        return 1
