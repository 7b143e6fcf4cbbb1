"""Each family's tiny model: its chat template renders a conversation with the family's real special tokens and its
system-role rule, its generation prompt and end of turn are the family's, and SFT masks exactly the assistant turns."""

import copy

import pytest
from transformers import AutoConfig, AutoTokenizer, GenerationConfig

from oxrl_core.data.sft import chat_template_ids, tokenize_sft
from oxrl_core.models.families import FAMILIES, family_of
from oxrl_core.models.tiny import TINY_MODELS, resolve_tiny_model

SYSTEM = {"role": "system", "content": "Be brief."}
TURNS = [
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "<answer>5</answer>"},
    {"role": "user", "content": "And 4 + 4?"},
    {"role": "assistant", "content": "<answer>8</answer>"},
]
CHATML = (
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    "<answer>5</answer><|im_end|>\n<|im_start|>user\nAnd 4 + 4?<|im_end|>\n<|im_start|>assistant\n"
    "<answer>8</answer><|im_end|>\n"
)
GEMMA_TURNS = (
    "<start_of_turn>model\n<answer>5</answer><end_of_turn>\n<start_of_turn>user\nAnd 4 + 4?<end_of_turn>\n"
    "<start_of_turn>model\n<answer>8</answer><end_of_turn>\n"
)
# tiny model -> (the conversation with its system message rendered, or None where the family refuses it; the
# generation prompt; each assistant turn's trained text; the tokens that end generation)
CONVENTIONS = {
    "oxrl-tiny-llama": (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2 + 3?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n<answer>5</answer><|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nAnd 4 + 4?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n<answer>8</answer><|eot_id|>",
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        ["<answer>5</answer><|eot_id|>", "<answer>8</answer><|eot_id|>"],
        {"<|eot_id|>"},
    ),
    "oxrl-tiny-mistral": (
        "<s>[INST] Be brief.\n\nWhat is 2 + 3? [/INST]<answer>5</answer></s>[INST] And 4 + 4? [/INST]"
        "<answer>8</answer></s>",
        " [/INST]",
        ["<answer>5</answer></s>", "<answer>8</answer></s>"],
        {"</s>"},
    ),
    "oxrl-tiny-gemma2": (
        None,
        "<start_of_turn>model\n",
        ["<answer>5</answer><end_of_turn>\n", "<answer>8</answer><end_of_turn>\n"],
        {"<end_of_turn>"},
    ),
    "oxrl-tiny-gemma3": (
        "<bos><start_of_turn>user\nBe brief.\n\nWhat is 2 + 3?<end_of_turn>\n" + GEMMA_TURNS,
        "<start_of_turn>model\n",
        ["<answer>5</answer><end_of_turn>\n", "<answer>8</answer><end_of_turn>\n"],
        {"<end_of_turn>"},
    ),
    "oxrl-tiny-phi3": (
        "<|system|>\nBe brief.<|end|>\n<|user|>\nWhat is 2 + 3?<|end|>\n<|assistant|>\n<answer>5</answer><|end|>\n"
        "<|user|>\nAnd 4 + 4?<|end|>\n<|assistant|>\n<answer>8</answer><|end|>\n<|endoftext|>",
        "<|assistant|>\n",
        # the template closes a rendering with EOS, which it does not put between turns: the last turn learns it
        ["<answer>5</answer><|end|>\n", "<answer>8</answer><|end|>\n<|endoftext|>"],
        {"<|end|>", "<|endoftext|>"},
    ),
}
for chatml in (
    "oxrl-tiny",
    "oxrl-tiny-qwen3",
    "oxrl-tiny-qwen3-moe",
    "oxrl-tiny-qwen3-5",
    "oxrl-tiny-qwen3-5-moe",
    "oxrl-tiny-qwen2-5-vl",
):
    CONVENTIONS[chatml] = (
        CHATML,
        "<|im_start|>assistant\n",
        ["<answer>5</answer><|im_end|>\n", "<answer>8</answer><|im_end|>\n"],
        {"<|im_end|>"},
    )


@pytest.fixture(scope="module", params=sorted(CONVENTIONS))
def tiny(request, _isolated_dirs):
    folder = resolve_tiny_model(request.param)
    return request.param, AutoTokenizer.from_pretrained(folder), folder


def _text(tokenizer, ids) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False)


def test_the_template_renders_the_family_s_special_tokens_and_system_rule(tiny):
    name, tokenizer, _ = tiny
    rendered, prompt, _, _ = CONVENTIONS[name]
    if rendered is None:
        with pytest.raises(ValueError, match="system role is not supported"):
            chat_template_ids(tokenizer, [SYSTEM, *TURNS], add_generation_prompt=False)
    else:
        ids = chat_template_ids(tokenizer, [SYSTEM, *TURNS], add_generation_prompt=False)
        assert _text(tokenizer, ids) == rendered
        # every marker is one token of the vocabulary, not spelled out in pieces
        markers = [t for t in tokenizer.all_special_tokens if t in rendered]
        assert markers and all(tokenizer.convert_tokens_to_ids(t) in ids for t in markers)
    assert _text(tokenizer, chat_template_ids(tokenizer, TURNS[:1], add_generation_prompt=True)).endswith(prompt)


def test_roles_out_of_turn_are_refused_where_the_family_refuses_them(tiny):
    name, tokenizer, _ = tiny
    two_users = [TURNS[0], TURNS[2]]
    if name in ("oxrl-tiny-mistral", "oxrl-tiny-gemma2", "oxrl-tiny-gemma3"):
        with pytest.raises(ValueError, match="alternate"):
            chat_template_ids(tokenizer, two_users, add_generation_prompt=True)
    else:
        assert chat_template_ids(tokenizer, two_users, add_generation_prompt=True)


def test_sft_trains_exactly_each_assistant_turn_and_its_end(tiny):
    name, tokenizer, _ = tiny
    example = tokenize_sft(TURNS, tokenizer, max_len=1024)
    ids, mask = example.input_ids, example.target_mask
    spans, start = [], None
    for i, bit in enumerate([*mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            spans.append(_text(tokenizer, ids[start:i]))
            start = None
    assert spans == CONVENTIONS[name][2]


def test_generation_ends_at_the_family_s_end_of_turn(tiny):
    name, tokenizer, folder = tiny
    config = AutoConfig.from_pretrained(folder).get_text_config()
    eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    generation = GenerationConfig.from_pretrained(folder) if (folder / "generation_config.json").is_file() else None
    if generation is not None:
        eos = generation.eos_token_id if isinstance(generation.eos_token_id, list) else [generation.eos_token_id]
    assert set(tokenizer.convert_ids_to_tokens(eos)) == CONVENTIONS[name][3]


def test_every_family_has_a_tiny_model_of_its_model_type_and_its_conventions_are_tested():
    assert {family.tiny_model for family in FAMILIES} == set(TINY_MODELS)
    for family in FAMILIES:
        config = AutoConfig.from_pretrained(resolve_tiny_model(family.tiny_model))
        assert family_of(config.model_type) is family
    multimodal_only = {"oxrl-tiny-vl", "oxrl-tiny-qwen3-vl", "oxrl-tiny-smolvlm", "oxrl-tiny-audio"}
    assert set(TINY_MODELS) - multimodal_only == set(CONVENTIONS)


@pytest.fixture(scope="module")
def qwen3_5_text_models(_isolated_dirs):
    """Text-only Qwen3.5s of the tiny model's language model (one Gated DeltaNet layer, one gated attention layer),
    float32 on the CPU: padded with SDPA, packed as the ranks pack (the DeltaNet layers run per sequence), and packed
    with the layers as transformers has them."""
    import torch
    from transformers import Qwen3_5ForCausalLM

    from oxrl_core.models.families.qwen3_5 import run_deltanet_per_sequence
    from oxrl_core.training.attention import ATTENTION

    text = AutoConfig.from_pretrained(resolve_tiny_model("oxrl-tiny-qwen3-5")).text_config
    torch.manual_seed(0)
    # a model keeps its attention in its config: one copy each
    padded = Qwen3_5ForCausalLM._from_config(copy.deepcopy(text), attn_implementation="sdpa", dtype=torch.float32)
    packed, leaky = (Qwen3_5ForCausalLM._from_config(copy.deepcopy(text), attn_implementation=ATTENTION) for _ in "ab")
    for model in (packed, leaky):
        model.load_state_dict(padded.state_dict())
    run_deltanet_per_sequence(packed)
    return padded, packed, leaky


def test_qwen3_5_sequences_packed_in_one_row_have_the_logprobs_and_gradients_of_each_alone(qwen3_5_text_models):
    import torch

    from oxrl_core.training.logprobs import token_logprobs
    from oxrl_core.training.packing import pack, unpack, unpacking

    padded, packed, leaky = qwen3_5_text_models
    lengths = [7, 12]
    generator = torch.Generator().manual_seed(1)
    rows = [torch.randint(5, 400, (n,), generator=generator) for n in lengths]
    input_ids = torch.zeros(2, max(lengths), dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for b, row in enumerate(rows):
        input_ids[b, : len(row)], attention_mask[b, : len(row)] = row, 1
    alone = [token_logprobs(padded(input_ids=row[None]).logits, row[None])[0] for row in rows]
    sum(a.sum() for a in alone).backward()
    inputs, layout = pack(input_ids, attention_mask), unpacking(attention_mask)
    got = unpack(token_logprobs(packed(**inputs).logits, inputs["input_ids"]), layout)
    (got * attention_mask[:, 1:]).sum().backward()
    for b, n in enumerate(lengths):
        torch.testing.assert_close(got[b, : n - 1], alone[b], atol=1e-5, rtol=0)
    for (name, a), b in zip(padded.named_parameters(), packed.parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4, msg=name)
    # as transformers has them, the DeltaNet layers carry the first sequence's state into the second
    with torch.no_grad():
        naive = unpack(token_logprobs(leaky(**inputs).logits, inputs["input_ids"]), layout)
    assert (naive[1, : lengths[1] - 1] - alone[1]).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["oxrl-tiny-qwen2-5-vl", "oxrl-tiny-qwen3-5", "oxrl-tiny-qwen3-5-moe"])
def test_lora_on_a_multimodal_entry_s_targets_stays_out_of_its_media_encoder(name):
    """Qwen2.5-VL's vision MLP has the language model's gate_proj, up_proj and down_proj: adapters there would
    train a frozen tower that no refresh sends."""
    from types import SimpleNamespace

    import torch
    from transformers import AutoModelForMultimodalLM

    from oxrl_core.config.sections import LoraSection
    from oxrl_core.model_registry.scout import scout
    from oxrl_core.models.hub import media_encoder
    from oxrl_core.training.build import with_lora

    folder = resolve_tiny_model(name)
    targets = scout(str(folder)).entry.lora_targets
    spec = SimpleNamespace(
        model=SimpleNamespace(gradient_checkpointing=False), lora=LoraSection(target_modules=targets)
    )
    model = with_lora(AutoModelForMultimodalLM.from_pretrained(folder, dtype=torch.float32), spec, False, False, True)
    tower = {id(p) for p in media_encoder(model).parameters()}
    adapters = [n for n, p in model.named_parameters() if "lora_" in n]
    assert adapters and not [n for n, p in model.named_parameters() if "lora_" in n and id(p) in tower]
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in adapters} == set(targets)
