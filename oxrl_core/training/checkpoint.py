"""A rank's checkpoints: DeepSpeed's state with its RNG's for a resume, and the Hugging Face folder for use."""

from pathlib import Path

import torch

from oxrl_core.models.names import restore_checkpoint_names
from oxrl_core.models.value_head import VALUE_HEAD_FILE


class Checkpoints:
    """Saving and loading, methods of a trainer rank's Ray actor (`TrainEngine`, which provides `engine`, `_policy()`,
    `spec`, `rank`, `critic`, `vision` and `zero3`). Every rank calls each of them: ZeRO shards what they save."""

    def save_checkpoint(self, ds_dir: Path, tag: str) -> None:
        """Optimizer, schedule, weights (DeepSpeed's format) and this rank's RNG state."""
        self.engine.save_checkpoint(str(ds_dir), tag=tag, save_latest=False)
        torch.save(_rng_state(), ds_dir / tag / f"rng_rank{self.rank}.pt")

    def load_checkpoint(self, ds_dir: Path, tag: str) -> None:
        """What `save_checkpoint` saved, back in place: a resumed run goes on as if never stopped."""
        path, _ = self.engine.load_checkpoint(
            str(ds_dir), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if path is None:
            raise RuntimeError(f"DeepSpeed found no checkpoint {tag} in {ds_dir}")
        _set_rng_state(torch.load(ds_dir / tag / f"rng_rank{self.rank}.pt", weights_only=False))

    def save_hf(self, out_dir: Path, tokenizer_dir: str) -> None:
        """A Hugging Face folder (safetensors + tokenizer); with LoRA, the adapter only; PPO's value head beside it."""
        state = self._gathered(trainable_only=self.spec.lora.enabled)  # with LoRA the base is unchanged
        if self.rank == 0:
            from safetensors.torch import save_file
            from transformers import AutoProcessor, AutoTokenizer

            policy_state = {name.removeprefix("policy."): t for name, t in state if not name.startswith("value_head.")}
            self._policy().save_pretrained(out_dir, state_dict=policy_state, safe_serialization=True)
            restore_checkpoint_names(out_dir, self._policy().config.model_type)
            if self.critic:
                save_file(
                    {n.removeprefix("value_head."): t for n, t in state if n.startswith("value_head.")},
                    out_dir / VALUE_HEAD_FILE,
                )
            # a multimodal model's processor: the tokenizer, the image processor or feature extractor, the chat template
            (AutoProcessor if self.multimodal else AutoTokenizer).from_pretrained(tokenizer_dir).save_pretrained(
                out_dir
            )
        torch.distributed.barrier()

    def _gathered(self, trainable_only: bool) -> list[tuple[str, torch.Tensor]]:
        """(name, full tensor) on rank 0. Under ZeRO-3 each rank holds a shard of every
        parameter: gather them one at a time (every rank must join) and copy to CPU."""
        import deepspeed

        pairs = []
        for name, param in self.engine.module.named_parameters():
            if trainable_only and not param.requires_grad:
                continue
            with deepspeed.zero.GatheredParameters([param], enabled=self.zero3):
                if self.rank == 0:
                    pairs.append((name, param.detach().to("cpu", copy=True)))
        return pairs


def _rng_state() -> dict:
    """This process's RNG states, the CPU's and the GPU's: dropout goes on where it left off after a resume."""
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    """Back to the RNG states `_rng_state` read."""
    torch.set_rng_state(state["cpu"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])
