"""The RL stage: task + tokenizer (task.py, tokenizer.py), data files (data.py, `minite data`), SFT base model
(pretrain.py, `minite pretrain`), GRPO math as pure functions (grpo.py), the GRPO loop per engine pair (train.py,
`minite rl`), resumable run state (checkpoint.py) and the curves figure (figures.py). Importing this package
imports nothing heavy: each module is imported where it is used."""
