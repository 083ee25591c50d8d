"""The verifiable RL task, made locally: character-level tokenizer (token ids every engine shares), the arithmetic
task + rewards, train / held-out JSONL data. Imports nothing heavy: each module is imported where it is used."""
