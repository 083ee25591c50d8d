"""What executes, decided once per command: the kernel backend, the rollout engine, and the environment's overrides
of profile knobs.

A command resolves one frozen `Execution` from its run options (`--kernels`, `--sampler-engine`: the DAG fills
them from the experiment's `kernels` and `sampler_engine` keys) and the documented environment variables,
installs it for the process, records it in every result's `env` (results.set_run_env) and passes it down (the
rollout engine to `make_sampler`). Every other numeric choice is a profile knob (profiles.py).

| choice           | run option (experiment key)       | environment override | auto                               |
|------------------|-----------------------------------|----------------------|------------------------------------|
| kernel backend   | --kernels (kernels)               | MINITE_KERNELS       | native on sm_100+, triton on other |
|                  |                                   |                      | CUDA GPUs, reference on CPU        |
| rollout engine   | --sampler-engine (sampler_engine) | MINITE_SAMPLER       | fast on CUDA, reference on CPU     |
| attention kernel | the profile's `attention_kernel`  | MINITE_ATTENTION     | (the profile's own)                |

Precedence: an explicit run option (anything but "auto") > its environment variable > automatic. A variable
that decides a choice is recorded (`env.overrides`); nothing else reads these variables, so no numeric choice
of a result comes from the environment unrecorded. A bad value fails before any work, naming where it came from.

The backend and a knob override are installed for the process rather than handed to each call because they act
below the engines — in kernels.dispatch, and where a profile is put on the model (profiles.effective) — also in
the backward an RL update runs after the engine has returned. `active()` scopes the same for a block (tests, a
stage run in-process).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

from minite_core import profiles
from minite_core.engines.engine_choice import ENGINES, resolve_engine
from minite_core.kernels import dispatch
from minite_core.results import set_run_env

KERNELS_VAR, SAMPLER_VAR, ATTENTION_VAR = "MINITE_KERNELS", "MINITE_SAMPLER", "MINITE_ATTENTION"
KERNEL_CHOICES = ("auto", *dispatch.BACKENDS)
ENGINE_CHOICES = ("auto", *ENGINES)


@dataclass(frozen=True)
class Execution:
    kernels: str  # the kernel backend: reference | triton | native
    sampler_engine: str  # the rollout engine: reference | fast | fast-eager
    attention_kernel: str | None = None  # every profile's attention kernel, from MINITE_ATTENTION; None: its own
    overrides: tuple[tuple[str, str], ...] = ()  # (variable, value) of each environment variable that decided

    @classmethod
    def resolve(cls, *, device: str = "cpu", kernels: str = "auto", sampler_engine: str = "auto",
                environ=None) -> "Execution":
        """The execution of a command on `device` (module docstring); ValueError naming the bad input."""
        env = os.environ if environ is None else environ
        overrides = []

        def choose(option: str | None, flag: str, var: str, choices) -> tuple[str | None, str]:
            """(value, where it came from): the option unless "auto", else the variable, else None (auto)."""
            if option not in (None, "auto"):
                return option, f"{flag} {option}"
            value = env.get(var) or None
            if value is None:
                return None, ""
            if value not in choices:
                raise ValueError(f"${var}={value!r} is not one of {list(choices)}: fix or unset it")
            overrides.append((var, value))
            return value, f"${var}={value}"

        backend, source = choose(kernels, "--kernels", KERNELS_VAR, dispatch.BACKENDS)
        if backend is not None:
            ok, reason = dispatch.backend_available(backend)
            if not ok:
                raise ValueError(f"{source}: kernel backend {backend!r} is not usable here: {reason}")
        engine, _ = choose(sampler_engine, "--sampler-engine", SAMPLER_VAR, ENGINES)
        attention, _ = choose(None, "", ATTENTION_VAR, profiles.ATTENTION_KERNELS)
        return cls(kernels=backend or dispatch.auto_backend(), sampler_engine=resolve_engine(engine, device),
                   attention_kernel=attention, overrides=tuple(overrides))

    @property
    def knob_overrides(self) -> dict:
        """The profile knobs this execution overrides in every profile (profiles.set_overrides)."""
        return {} if self.attention_kernel is None else {"attention_kernel": self.attention_kernel}

    def record(self) -> dict:
        """What every result's env records of it."""
        return {"kernels": self.kernels, "sampler_engine": self.sampler_engine, "overrides": dict(self.overrides)}

    def install(self) -> "Execution":
        """For the rest of the process (a command): the backend, the knob overrides, the record."""
        dispatch.set_backend(self.kernels)
        profiles.set_overrides(**self.knob_overrides)
        set_run_env(**self.record())
        return self

    @contextmanager
    def active(self):
        """`install` for a block: the process's backend and knob overrides are restored afterwards."""
        with dispatch.using_backend(self.kernels), profiles.overriding(**self.knob_overrides):
            yield self
