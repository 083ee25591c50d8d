"""Optional real engines beside our emulations: the vLLM sampler and the vLLM comparison (in the vLLM peer venv),
the Transformer Engine learner (sm_100+). Import-guarded: each reports (available, reason) and never falls back."""
