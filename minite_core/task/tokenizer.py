"""Character-level tokenizer for the synthetic RL task, built locally (no hub).

What: a ``transformers.PreTrainedTokenizerFast`` whose every token is one character of a fixed alphabet, plus four
special tokens. ``save_tokenizer`` writes ``tokenizer.json`` + ``tokenizer_config.json`` with ``save_pretrained`` so
``AutoTokenizer.from_pretrained(dir)`` loads it offline (vLLM and lm-eval load it the same way).

Why character level: token count == character count, so the task's 64–256 character responses are 64–256 tokens
(DESIGN.md RL), the vocabulary (and the LM head) stays tiny, and there is no merge table whose boundaries could
differ between engines.

How (tokenizers library): a ``WordLevel`` model over single characters behind a ``Split`` pre-tokenizer that isolates
every character (the regex ``[\\s\\S]`` also matches newlines), and a ``Fuse`` decoder that concatenates tokens, so
``decode(encode(s)) == s`` exactly, spaces and newlines included (the default WordLevel decoder would join tokens
with spaces). ``clean_up_tokenization_spaces=False`` keeps transformers from editing spaces around punctuation.

Special tokens and conventions (the training loop and the sampler rely on these):
- ``<pad>`` id 0, ``<bos>`` id 1, ``<eos>`` id 2, ``<unk>`` id 3 (any character outside the alphabet).
- ``tok(text)`` (``add_special_tokens=True``) prepends ``<bos>``; nothing is appended. Prompts are encoded with
  ``<bos>``; responses with ``add_special_tokens=False`` followed by ``<eos>``, which ends generation.
- ``padding_side="right"`` (training); a sampler that left-pads sets it per call.
"""
from __future__ import annotations

import string
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoTokenizer, PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)  # ids 0..3 in this order
# The task uses digits, "+*=:,->", lowercase words, space and newline; a few more punctuation marks and the whole
# lowercase alphabet are included so prompt/response wording can change without a new vocabulary.
CHARS: tuple[str, ...] = tuple("\n " + string.digits + "+-*/=:,.>?()" + string.ascii_lowercase)
VOCAB: tuple[str, ...] = SPECIAL_TOKENS + CHARS  # 4 + 2 + 10 + 12 + 26 = 54 entries; id = position
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
MODEL_MAX_LENGTH = 512  # <bos> + prompt (< 32) + response (<= 256) + <eos> with room for longer variants

assert len(set(VOCAB)) == len(VOCAB) < 64


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The character-level tokenizer (deterministic; ``len(tok) == len(VOCAB)``)."""
    tk = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token=UNK))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tk.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, BOS_ID)]
    )
    tk.add_special_tokens(list(SPECIAL_TOKENS))  # matched before pre-tokenization, never split into characters
    return PreTrainedTokenizerFast(
        tokenizer_object=tk,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        model_max_length=MODEL_MAX_LENGTH,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(tok: PreTrainedTokenizerFast, directory: str | Path) -> Path:
    """``save_pretrained`` into ``directory``; returns it. Reload with ``load_tokenizer`` or ``AutoTokenizer``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(directory))
    return directory


def load_tokenizer(directory: str | Path) -> PreTrainedTokenizerFast:
    """``AutoTokenizer.from_pretrained(directory)`` offline (``local_files_only``); a directory without
    tokenizer.json is an error naming it."""
    if not (Path(directory) / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{directory} has no tokenizer.json (save_tokenizer writes it; `minite data` puts "
                                "one under <data>/tokenizer, pretrain and rl copy it beside their checkpoints)")
    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)


def encode(tok, examples: list[dict]) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt ids with <bos>, response ids + <eos>) per example: the conventions above."""
    prompts = tok([e["prompt"] for e in examples])["input_ids"]
    responses = tok([e["response"] for e in examples], add_special_tokens=False)["input_ids"]
    return [list(p) for p in prompts], [list(r) + [EOS_ID] for r in responses]


def decode_response(tok, ids: list[int]) -> str:
    return tok.decode([t for t in ids if t != EOS_ID], skip_special_tokens=True)


def calibration_sequences(tok, examples: list[dict]) -> list[list[int]]:
    """<bos> + prompt + response + <eos> per example: what every stage calibrates static scales on."""
    prompts, responses = encode(tok, examples)
    return [p + r for p, r in zip(prompts, responses)]
