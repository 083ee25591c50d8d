"""The task's tokenizers, built locally (no hub): character level (the CPU smoke) or byte-level BPE trained on the
task text (the GPU experiments). Both are ``transformers.PreTrainedTokenizerFast`` with the same four special tokens
at the same ids, saved with ``save_pretrained`` so ``AutoTokenizer.from_pretrained(dir)`` loads them offline (vLLM
and lm-eval load them the same way).

Character level (``build_tokenizer``): every token is one character of a fixed alphabet. Token count == character
count, so the task's 64–256 character responses are 64–256 tokens, the vocabulary (and the LM head) stays tiny,
and there is no merge table whose boundaries could differ between engines. How (tokenizers library): a
``WordLevel`` model over single characters behind a ``Split`` pre-tokenizer that isolates every character (the
regex ``[\\s\\S]`` also matches newlines), and a ``Fuse`` decoder that concatenates tokens, so
``decode(encode(s)) == s`` exactly (the default WordLevel decoder would join tokens with spaces).

Byte-level BPE (``train_bpe_tokenizer``): what real models use, so that the LM head weighs what it does there (a
vocabulary of ~1,300 tokens on the task text rather than 54). Llama 3's pre-tokenizer (its split regex, then GPT-2's
byte-to-unicode map): numbers are cut into chunks of at most 3 digits, left to right, words keep their leading
space, and BPE merges only inside a chunk. Trained on the train split's prompts + responses (never held-out text)
with ``vocab_size`` as a ceiling: on the task text the merges run out first (every 1-3 digit number, the task's
words and operators: 1,301 tokens for add3 + mul3x1, 478 for add2 alone), so the vocabulary is the text's, not a
padded round number. Deterministic: the trainer breaks ties by the pair itself, not by hash order (tests train
twice and compare the saved files byte for byte). A response is ~0.53 BPE token a character: add2's 73–77
characters are 38 tokens, add3 / mul3x1's 91–98 are 49–51, add5 76, mul2x2 104–118, mul3x2 140–155.

Special tokens and conventions (the training loop and the sampler rely on these, for both kinds):
- ``<pad>`` id 0, ``<bos>`` id 1, ``<eos>`` id 2, ``<unk>`` id 3 (any character outside the character alphabet;
  byte-level BPE encodes every string and never emits it).
- ``tok(text)`` (``add_special_tokens=True``) prepends ``<bos>``; nothing is appended. Prompts are encoded with
  ``<bos>``; responses with ``add_special_tokens=False`` followed by ``<eos>``, which ends generation. A prompt ends
  in ``=\\n`` and a response starts with a letter, so encoding the two apart gives the tokens of encoding their
  concatenation (the pre-tokenizer splits there either way).
- ``clean_up_tokenization_spaces=False`` keeps transformers from editing spaces around punctuation;
  ``padding_side="right"`` (training); a sampler that left-pads sets it per call.
"""
from __future__ import annotations

import string
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)  # ids 0..3 in this order
# The task uses digits, "+*=:,->", lowercase words, space and newline; a few more punctuation marks and the whole
# lowercase alphabet are included so prompt/response wording can change without a new vocabulary.
CHARS: tuple[str, ...] = tuple("\n " + string.digits + "+-*/=:,.>?()" + string.ascii_lowercase)
VOCAB: tuple[str, ...] = SPECIAL_TOKENS + CHARS  # 4 + 2 + 10 + 12 + 26 = 54 entries; id = position
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
MODEL_MAX_LENGTH = 512  # <bos> + prompt (< 32) + response (<= 256) + <eos> with room for longer variants
KINDS = ("char", "bpe")  # DataConfig.tokenizer
# Llama 3's pre-tokenizer regex (its tokenizer.json): contractions, words with one leading non-letter, numbers in
# chunks of <= 3 digits, punctuation runs with their newlines, newline runs, spaces
BPE_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")

assert len(set(VOCAB)) == len(VOCAB) < 64


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The character-level tokenizer (deterministic; ``len(tok) == len(VOCAB)``)."""
    tk = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token=UNK))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    return _wrap(tk)


def train_bpe_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on ``texts`` (module docstring), at most ``vocab_size`` tokens: the four special
    tokens (ids 0..3), the 256 byte symbols, then the merges in the order learned."""
    if vocab_size < len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"a byte-level BPE vocabulary holds the {len(SPECIAL_TOKENS)} special tokens and 256 bytes: "
                         f"vocab_size must be >= {len(SPECIAL_TOKENS) + 256}, got {vocab_size}")
    if not texts:
        raise ValueError("BPE training needs text: no training examples")
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(BPE_SPLIT), behavior="isolated"),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(texts, trainer)
    return _wrap(tk)


def make_tokenizer(kind: str, texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """The tokenizer of ``kind`` ("char": ``texts`` and ``vocab_size`` unused; "bpe": trained on ``texts``)."""
    if kind == "char":
        return build_tokenizer()
    if kind == "bpe":
        return train_bpe_tokenizer(texts, vocab_size)
    raise ValueError(f"unknown tokenizer kind {kind!r}; one of {list(KINDS)}")


def _wrap(tk: Tokenizer) -> PreTrainedTokenizerFast:
    """The conventions of the module docstring on a tokenizers ``Tokenizer``: <bos> prepended, specials matched
    whole (never split by the pre-tokenizer), right padding, no space clean-up."""
    tk.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, BOS_ID)]
    )
    tk.add_special_tokens(list(SPECIAL_TOKENS))
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
