"""A word-level Hugging Face fast tokenizer built offline, for model folders the tests save."""

from __future__ import annotations

WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "big", "red"]


def make_tokenizer(words=WORDS):
    """A word-level fast tokenizer: [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3, then the words; pairs get type ids."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *words])}
    tk = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = Whitespace()
    tk.post_processor = TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                           special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", model_input_names=["input_ids", "token_type_ids", "attention_mask"])


def saved_with_tokenizer(model, folder):
    """`folder` holding `model` (save_pretrained) with the word-level tokenizer beside it, as a user
    would save a Hugging Face model for diagnose."""
    model.save_pretrained(folder)
    make_tokenizer().save_pretrained(folder)
    return folder
