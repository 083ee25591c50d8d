"""Execution diagnostics: the first-divergence trace (`trace`), one-knob attribution (`attribution`), the
`minite diagnose` command (`cli`) and its figures (`figures`). The mismatch metrics themselves live one floor down
in `engines.mismatch` (the RL loop and the vLLM peer log them too). This package imports nothing heavy."""
