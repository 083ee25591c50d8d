"""Execution diagnostics: learner↔sampler mismatch metrics (`metrics`), the first-divergence trace (`trace`),
one-knob attribution (`attribution`), the `minite diagnose` command (`cli`) and its figures (`figures`).
Import the submodules directly; this package imports nothing heavy."""
