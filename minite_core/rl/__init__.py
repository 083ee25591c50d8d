"""The RL stage: SFT base model (pretrain.py, `minite pretrain`), GRPO math as pure functions (grpo.py), the GRPO
loop per engine pair (train.py, `minite rl`) and the curves figure (figures.py). The task, tokenizer and data live
in `minite_core.task`, run state and resume in `minite_core.runs`. Importing this package imports nothing heavy."""
