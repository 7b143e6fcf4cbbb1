"""A trained reward model as the RL reward (RLHF scoring, Ouyang et al. 2022, arXiv 2203.02155).

The model is a Hugging Face sequence-classification model with one label, as
`oxrl train sl --alg rm` saves it (Bradley-Terry). The score of a sample is its
logit at the last non-pad token (Hugging Face's own pooling, as in training) of
the conversation: the record's prompt messages plus the response as an
assistant turn, rendered by the reward model's own chat template, so that its
tokenizer may differ from the policy's.

It runs in the RL driver process, not in a Ray actor: float32 on CPU, bfloat16
on GPU 0 when CUDA is available, beside whatever Ray places on that GPU (with
colocated training and vLLM, leave room for it).
"""

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from oxrl_core.data.records import prompt_messages
from oxrl_core.data.sft import chat_template_ids
from oxrl_core.errors import OxrlError

TRAIN_ONE = "train one with `oxrl train sl --alg rm`"


class RewardModel:
    """A reward: `score_batch(responses, samples)` scores many samples in batches of `batch_size`;
    calling it with one `(response, sample)` scores that one."""

    def __init__(self, path: str, batch_size: int = 16):
        where = f"reward.kwargs.path={path!r}"
        if type(batch_size) is not int or batch_size < 1:
            raise OxrlError(
                f"reward.kwargs.batch_size={batch_size!r}: must be a positive integer (conversations per forward pass)"
            )
        folder = Path(path)
        if not folder.is_dir():
            raise OxrlError(f"{where}: no such folder; it must hold a reward model ({TRAIN_ONE})")
        try:
            config = AutoConfig.from_pretrained(folder, local_files_only=True)
        except (OSError, ValueError) as e:
            raise OxrlError(
                f"{where}: not a Hugging Face model folder ({str(e).splitlines()[0]}); {TRAIN_ONE}"
            ) from None
        architectures = config.architectures or []
        if not any(a.endswith("ForSequenceClassification") for a in architectures):
            raise OxrlError(
                f"{where}: holds {' / '.join(architectures) or 'a model of no known architecture'}, not a reward "
                f"model (a sequence-classification model with one label); {TRAIN_ONE}"
            )
        if config.num_labels != 1:
            raise OxrlError(
                f"{where}: a classifier with {config.num_labels} labels; a reward model has one (its score); {TRAIN_ONE}"
            )
        self.pad_id = config.get_text_config().pad_token_id  # the pooling reads the last token that is not this one
        if self.pad_id is None:
            raise OxrlError(
                f"{where}: its config.json has no pad_token_id, which batched scoring pads with; set it "
                f"(the id the model was trained with) or {TRAIN_ONE}"
            )
        self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        if not self.tokenizer.chat_template:
            raise OxrlError(f"{where}: its tokenizer has no chat template; conversations are rendered with it")
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=dtype, local_files_only=True)
        self.model.to(self.device).eval()
        self.batch_size = batch_size

    @torch.inference_mode()
    def score_batch(self, responses: list[str], samples: list[dict]) -> list[float]:
        """The score of each response to its sample's prompt; one forward pass per `batch_size` of them."""
        conversations = [
            prompt_messages(sample) + [{"role": "assistant", "content": response}]
            for response, sample in zip(responses, samples, strict=True)
        ]
        token_ids = [chat_template_ids(self.tokenizer, c, add_generation_prompt=False) for c in conversations]
        scores = []
        for start in range(0, len(token_ids), self.batch_size):
            chunk = token_ids[start : start + self.batch_size]
            input_ids = torch.full(
                (len(chunk), max(map(len, chunk))), self.pad_id, dtype=torch.long
            )  # [B, T] right-padded
            attention_mask = torch.zeros_like(input_ids)  # [B, T]
            for b, ids in enumerate(chunk):
                input_ids[b, : len(ids)] = torch.tensor(ids)
                attention_mask[b, : len(ids)] = 1
            logits = self.model(
                input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device)
            ).logits  # [B, 1]
            scores += logits[:, 0].float().tolist()
        return scores

    def __call__(self, response: str, sample: dict) -> float:
        return self.score_batch([response], [sample])[0]
