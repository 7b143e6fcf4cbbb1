"""The run configuration's sections that every run shares: model, LoRA, data, DeepSpeed, run, the shared training
settings, rollout (with its environment) and reward (with its judge). They import no algorithm and no torch, so that
`oxrl doctor` reads their defaults on a machine whose torch is broken; `schema.py` joins them with each algorithm's
settings into the SL and RL configs.
"""

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from oxrl_core.algs.settings import PositiveFloat, PositiveInt, Section
from oxrl_core.errors import OxrlError


class ModelSection(Section):
    name_or_path: str = Field(
        "oxrl-tiny",
        description="Local folder, Hugging Face Hub id, or `oxrl-tiny` (the built-in tiny model, built locally on first use).",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Training dtype; `auto` is bfloat16 on GPU and float32 on CPU."
    )
    attn_implementation: Literal["varlen", "sdpa", "eager", "flash_attention_2"] = Field(
        "varlen",
        description="varlen: each micro-batch's sequences packed end to end, no padding, attention within each "
        "(torch's varlen_attn on CUDA); the others: padded micro-batches through transformers' kernel "
        "of that name. A reward model and a vision-language model always run padded (sdpa for varlen).",
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass to save memory."
    )
    compile: Literal["auto"] | bool = Field(
        "auto",
        description="Compile the training model's decoder layers with torch.compile (inductor): faster steps after "
        "a one-off compile of one layer (and again once the micro-batches' shape first changes); "
        "`auto` is on for GPUs, off on CPU.",
    )
    trust_remote_code: bool = Field(
        False, description="Allow model code from the Hub; off unless you trust the repository."
    )
    freeze_vision: bool = Field(
        True,
        description="Multimodal models: keep the vision encoder (and its merger) or the audio encoder frozen; "
        "false trains it too (full weights only: LoRA adapts the language model).",
    )
    router_aux_loss: bool = Field(
        False,
        description="Mixtures of experts: add the router's load-balancing loss, as the model defines it, weighted by "
        "its config's router_aux_loss_coef, to every algorithm's loss; off, it is logged only (router_aux_loss).",
    )


class LoraSection(Section):
    enabled: bool = Field(False, description="Train a LoRA adapter (peft) instead of all weights.")
    r: PositiveInt = Field(16, description="LoRA rank.")
    alpha: PositiveFloat = Field(32.0, description="LoRA scaling numerator (scale = alpha / r).")
    dropout: Annotated[float, Field(ge=0, lt=1)] = Field(0.0, description="Dropout on the LoRA input.")
    target_modules: list[str] = Field(
        ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        description="Module names (suffixes) that get adapters, or `all-linear`; checked against the model at load.",
    )


class DataSource(Section):
    path: Path = Field(strict=False, description="A .jsonl or .parquet file.")
    ratio: PositiveFloat = Field(1.0, description="Relative share of this source in every batch.")


class DataSection(Section):
    train: list[DataSource] = Field(min_length=1, description="Training sources, mixed by `ratio`.")
    val: Path | None = Field(
        None,
        strict=False,
        description="Held-out file; its loss is reported at the end (and every `train.eval_every` steps).",
    )
    max_len: PositiveInt = Field(1024, description="Prompt + response tokens; longer examples are truncated.")
    strict: bool = Field(False, description="Make a bad record fatal instead of skipped and counted (CLI: --strict).")


class DeepSpeedSection(Section):
    zero_stage: Literal[0, 1, 2, 3] = Field(
        2, description="ZeRO stage: 0 plain data parallel, 1 optimizer, 2 + gradients, 3 + parameters sharded."
    )
    offload_optimizer: bool = Field(
        False,
        description="Keep optimizer states in CPU memory and update there with DeepSpeed's CPU Adam, whose op compiles "
        "on first use (about a minute) (ZeRO 1-3).",
    )
    offload_param: bool = Field(False, description="Keep parameters in CPU memory (ZeRO 3).")
    zero_optimization: dict[str, Any] = Field(
        {},
        strict=False,
        description="More of DeepSpeed's `zero_optimization` settings, over oxrl's (e.g. `stage3_prefetch_bucket_size`, "
        "`stage3_param_persistence_threshold`), checked against DeepSpeed's own schema before any engine "
        "starts; the stage and offloading stay with the keys above.",
    )


class RunSection(Section):
    name: str = Field("oxrl-run", pattern=r"^[A-Za-z0-9._-]+$", description="Run folder name under `output_dir`.")
    output_dir: Path = Field(
        strict=False,
        default_factory=lambda: Path(os.environ.get("OXRL_CHECKPOINT_DIR", "checkpoints")),
        description="Where run folders go; default `$OXRL_CHECKPOINT_DIR` or ./checkpoints.",
    )
    train_ranks: PositiveInt = Field(
        1, description="DeepSpeed ranks: one GPU each on GPU machines, one process each on CPU."
    )
    checkpoint_every: Annotated[int, Field(ge=0)] = Field(
        0, description="Save a checkpoint every N steps (0: only at the end)."
    )
    save_final: bool = Field(
        True,
        description="Save the weights (`final/`) and a checkpoint when the run ends or a "
        "signal stops it; false keeps only what `checkpoint_every` saves "
        "(benchmarks, sweeps).",
    )
    tracking_uri: str | None = Field(
        None,
        description="MLflow tracking URI; default `$MLFLOW_TRACKING_URI`, else a SQLite store beside the run folders "
        "(`<output_dir>/mlflow.db`).",
    )
    hang_timeout_s: Annotated[float, Field(ge=0)] = Field(
        300.0,
        description="A wait on a trainer rank, vLLM engine or judge that runs past its deadline is a hang: the run "
        "names the stuck actor, writes every actor's Python stacks to stacks.txt and stops (resume from "
        "the last checkpoint). The deadline: 4 x this the first time a phase runs (start-up, "
        "compiling), later 5 x the phase's longest earlier run (scaled up to more work), never less "
        "than this. Also the process groups' timeout (4 x this). 0: no deadlines.",
    )


class TrainCommon(Section):
    lr: PositiveFloat = Field(1e-5, description="Peak learning rate (AdamW).")
    steps: PositiveInt = Field(100, description="Optimizer steps.")
    batch_size: PositiveInt = Field(8, description="Sequences per optimizer step, all ranks together.")
    micro_batch_size: PositiveInt = Field(8, description="Sequences per forward pass on one rank.")
    grad_accum: PositiveInt = Field(1, description="Micro-batches per optimizer step on one rank.")
    logprobs_micro_batch_size: PositiveInt | None = Field(
        None,
        description="Sequences per forward pass without gradients (old and reference logprobs, PPO's values) on "
        "one rank, a multiple of micro_batch_size: consecutive micro-batches run together. Such a "
        "forward keeps one layer's activations at a time, not every layer's, so it takes more sequences "
        "at no higher peak (and under ZeRO-3 gathers the weights fewer times). Default 4 x "
        "micro_batch_size; micro_batch_size under gradient checkpointing (where training too keeps one "
        "layer's at a time) and where the logits are made whole (KD, LoRA on the output layer).",
    )
    warmup_steps: Annotated[int, Field(ge=0)] = Field(0, description="Linear warm-up steps.")
    lr_scheduler: Literal["constant", "linear", "cosine"] = Field(
        "cosine", description="Decay after warm-up, over `steps`."
    )
    weight_decay: Annotated[float, Field(ge=0)] = Field(0.0, description="AdamW weight decay.")
    max_grad_norm: PositiveFloat = Field(1.0, description="Gradient clipping norm.")
    seed: int = Field(0, description="Seed for data order and initialisation.")


class EnvSection(Section):
    """`oxrl train rl`: each sample is an episode against an environment that answers the policy between its
    messages (tool results, feedback); only the policy's tokens train (docs/guides/multi-turn.md)."""

    name: str | None = Field(
        None,
        description="`calculator` (add, sub, mul and div tools for arithmetic), `guess-number` (higher or lower after "
        "each guess) or an importable `module:Class`; unset: one response per prompt.",
    )
    kwargs: dict = Field({}, description="Keyword arguments for the environment's class.")
    max_turns: Annotated[int, Field(ge=1, le=16)] = Field(
        4, description="Policy messages per episode at most; an episode cut here gets no reward from the environment."
    )
    max_episode_tokens: PositiveInt = Field(
        512,
        description="Tokens after the prompt per episode at most: the policy's, the environment's and the chat "
        "template's. An episode that reaches it ends truncated (see `rollout.mask_truncated`).",
    )


class RolloutSection(Section):
    @model_validator(mode="before")
    @classmethod
    def _refuse_moved_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and "max_sampling_rounds" in data:
            raise OxrlError(
                "rollout.max_sampling_rounds: moved to train.dapo.max_sampling_rounds (dynamic sampling is DAPO's)"
            )
        return data

    n_samples: PositiveInt = Field(8, description="Completions sampled per prompt (the group size).")
    temperature: Annotated[float, Field(ge=0)] = Field(1.0, description="Sampling temperature.")
    top_p: Annotated[float, Field(gt=0, le=1)] = Field(1.0, description="Nucleus sampling mass.")
    max_tokens: PositiveInt = Field(256, description="New tokens per completion.")
    max_prompt_len: PositiveInt = Field(512, description="Prompts longer than this are skipped and counted.")
    engines: PositiveInt = Field(1, description="vLLM engines (Ray actors).")
    tensor_parallel_size: PositiveInt = Field(
        1, description="GPUs per vLLM engine (on CPU: worker processes, for one engine)."
    )
    placement: Literal["auto", "colocated", "split"] = Field(
        "auto",
        description="colocated: each GPU holds a trainer rank and an engine worker (weights by CUDA IPC); split: "
        "engines on GPUs of their own (weights broadcast from trainer rank 0); auto: colocated when the "
        "ranks and engines do not fit side by side.",
    )
    weight_bucket_mb: PositiveInt = Field(
        1024,
        description="A refresh moves the weights to the engines in buckets of at most this many MiB (broadcast from "
        "trainer rank 0, or colocated on GPUs over CUDA IPC); the extra memory on either side is one "
        "bucket.",
    )
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = Field(
        0.5,
        description="Share of GPU memory vLLM may take (weights, activations, KV cache). On CPU unused: the KV cache "
        "is sized for a step's samples per engine.",
    )
    lag: Annotated[int, Field(ge=0, le=8)] = Field(
        0,
        description="Pipelined RL: the batch trained at step t was sampled by the policy of k steps earlier, exactly, "
        "while the engines sample step t + k's batch during step t's training (0: strictly on-policy, "
        "nothing overlaps). Colocated, the engines take turns with the trainers on their GPUs, which gains "
        "little; the sampler-trainer correction is `token-truncate` unless set. Reproducible: the same run "
        "gives the same weights, resumed or not (docs/guides/pipelined-rl.md).",
    )
    max_staleness: Annotated[int, Field(ge=0, le=8)] = Field(
        0,
        description="Asynchronous RL: the engines never wait for the trainer; each refresh reaches them between "
        "scheduler steps, samples in flight go on under the new weights (each token keeps the version that "
        "sampled it), and a batch starts sampling once it cannot end up more than s versions older than "
        "the policy that trains on it (0: off). Faster than rollout.lag, not reproducible. Colocated, the "
        "engines take turns with the trainers on their GPUs, which gains little; the sampler-trainer "
        "correction is `token-truncate` unless set (docs/guides/pipelined-rl.md).",
    )
    force_strict_on_policy: bool = Field(
        True,
        description="Refuse samples produced by another policy version than the run's schedule says: rollout.lag's "
        "exactly, or more than rollout.max_staleness versions old.",
    )
    mask_truncated: bool = Field(
        False,
        description="Leave responses cut at `max_tokens` (episodes: at `env.max_episode_tokens` too) out of the loss.",
    )
    router_replay: bool | None = Field(
        None,
        description="Mixtures of experts: the engines record each token's experts per layer as they sample, and the "
        "trainer's forwards route every token to them, with gate weights from its current router (router "
        "replay, R3), so that sampler and trainer run the same experts; off, the routes are recorded and "
        "the agreement is logged only (routing_agreement). Unset: on for a mixture of experts in RL; a "
        "dense model has no routes to replay.",
    )
    env: EnvSection = Field(
        default_factory=EnvSection, description="Multi-turn RL: the environment each episode runs against."
    )


class JudgeSection(Section):
    """`reward.func: judge` (RLAIF): another language model judges each response, served by a vLLM engine of its own
    inside the run, started once and never refreshed."""

    model: str | None = Field(
        None,
        description="The judge: a model folder, a Hugging Face Hub id or `oxrl-tiny`. Its own chat template (when it "
        "has one) wraps the rendered prompt as a user turn.",
    )
    score: Literal["number", "pairwise", "yes-probability"] = Field(
        "number",
        description="number: the judge ends with `Score: N`, N in [score_min, score_max], and the reward is N scaled "
        "to 0..1; pairwise: the judge picks the better of the response and the record's reference answer "
        "(`answer`) as `A` or `B`, asked twice with their order swapped, and the reward is the share of "
        "verdicts the response won (1, 0.5 or 0); yes-probability: nothing is generated, the reward is the "
        "judge's p(Yes) / (p(Yes) + p(No)) as its answer to the prompt.",
    )
    template: str | None = Field(
        None,
        description="The judge's prompt. number and yes-probability: {prompt}, {response} and optionally {reference} "
        "(the record's `answer`) are filled in; pairwise: {prompt}, {first} and {second}. Other braces are "
        "kept as they are. Default: a template for the scoring rule (docs/guides/rewards.md).",
    )
    score_min: float = Field(1.0, description="number: the lowest score the judge may give (reward 0).")
    score_max: float = Field(10.0, description="number: the highest score the judge may give (reward 1).")
    temperature: Annotated[float, Field(ge=0)] = Field(0.0, description="The judge's sampling temperature (0: greedy).")
    max_tokens: PositiveInt = Field(256, description="New tokens per judgment.")
    max_model_len: PositiveInt = Field(
        2048,
        description="The judge's context: prompt and judgment; a longer judge prompt scores `reward.on_error` and is reported.",
    )
    placement: Literal["own", "colocated"] = Field(
        "own",
        description="own: a GPU of its own (on CPU: a CPU slot beside the rest); colocated: on the GPU of trainer rank "
        "0, beside what runs there, with `gpu_memory_utilization` of its memory.",
    )
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = Field(
        0.85,
        description="Share of its GPU's memory the judge's vLLM may take; colocated, leave room for the trainer and "
        "the rollout engine. On CPU unused.",
    )
    log_max_mb: Annotated[float, Field(ge=0)] = Field(
        100.0,
        description="judgments.jsonl in the run folder (each judge prompt, its text and score) stops growing at this size; 0 writes none.",
    )


class RewardSection(Section):
    func: str = Field(
        "math",
        description="A shipped reward by name, `module:function`, `reward-model` (a trained reward model, "
        "`reward.kwargs.path`), `judge` (an LLM judge, `reward.judge`), or `env` (the environment's own "
        "score of each episode, 0 where it gave none). With `rollout.env`, the others score an episode's "
        "last policy message.",
    )
    kwargs: dict = Field({}, description="Keyword arguments for the reward function.")
    judge: JudgeSection = Field(
        default_factory=JudgeSection, description="reward.func=judge: the judge model and how it scores."
    )
    overlong_buffer: Annotated[int, Field(ge=0)] = Field(
        0,
        description="DAPO's soft overlong penalty: a response longer than `rollout.max_tokens` - this many tokens "
        "(episodes: `env.max_episode_tokens` - this) loses reward linearly, `overlong_penalty` at the "
        "limit; 0: off.",
    )
    overlong_penalty: PositiveFloat = Field(
        1.0, description="The reward a response at the length limit loses (see `overlong_buffer`)."
    )
    on_error: float = Field(
        0.0,
        description="Reward given to a sample whose reward function raised or whose judgment could not be read (the "
        "error is reported with the sample).",
    )
    workers: PositiveInt = Field(
        8,
        description="Samples a reward function scores at once, each on a thread of its own: a slow reward (a code "
        "sandbox, a remote service) waits for several at a time while the engines sample on. 1: one at a "
        "time, for a reward function that is not thread-safe. A reward model and a judge score a group in "
        "one batch.",
    )
