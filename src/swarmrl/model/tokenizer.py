"""A character-level tokenizer for the embedded model, saved as a standard HF tokenizer.

One token per printable ASCII character plus newline, and three specials. Built with
the `tokenizers` library so the model directory loads with `AutoTokenizer` like any
other Hugging Face checkpoint.
"""

from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
CHARACTERS = "\n" + "".join(c for c in string.printable if c.isprintable())


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """A fast tokenizer mapping every character to one id (unknown characters to <unk>)."""
    vocab = {tok: i for i, tok in enumerate([PAD, BOS, EOS, UNK])}
    for ch in CHARACTERS:
        vocab.setdefault(ch, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Split into single characters; WordLevel then maps each to its id.
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
    )
