"""A model's tokenizer as every loop, the judge, the merge and the evaluation load it."""


def load_tokenizer(model_path: str):
    """The model's tokenizer and the id that pads batches (pad token, else EOS)."""
    from transformers import AutoTokenizer  # here: importing this module (the CLI's modules do) costs no transformers

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return tokenizer, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
