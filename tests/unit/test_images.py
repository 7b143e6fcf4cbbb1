"""Images as a data concern: reading and sizing a record's images, binding them to their image parts, the image
tokens in the ids, and what the trainer's model reads of them."""

import base64
import io
import json

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoTokenizer

from oxrl_core.data.images import (bind_images, collapse_image_tokens, expand_image_tokens, image_policy, message_images,
                                   vision_inputs)
from oxrl_core.data.preference import collate_pairs, load_preference_examples
from oxrl_core.data.records import load_prompts, load_sft_examples
from oxrl_core.data.sft import collate_sft
from oxrl_core.errors import OxrlError
from oxrl_core.preprocess.shapes import square_images, vlm_preference_records, vlm_sft_records


@pytest.fixture(scope="module")
def tokenizer(tiny_vl_model_dir):
    return AutoTokenizer.from_pretrained(tiny_vl_model_dir)


@pytest.fixture(scope="module")
def policy(tokenizer):
    return image_policy(tokenizer)


def png(width: int, height: int, seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def user(*parts) -> list[dict]:
    return [{"role": "user", "content": list(parts)}]


IMAGE, TEXT = {"type": "image"}, {"type": "text", "text": "How many?"}


@pytest.mark.parametrize("width, height", [(56, 56), (30, 40), (500, 120), (13, 300), (1000, 1000), (60, 29)])
def test_sizing_gives_the_token_count_the_models_own_processor_gives_the_raw_image(tiny_vl_model_dir, policy, width, height):
    processor = AutoImageProcessor.from_pretrained(tiny_vl_model_dir)
    raw = Image.open(io.BytesIO(png(width, height)))
    own = int(processor(images=[raw], return_tensors="pt")["image_grid_thw"].prod() // processor.merge_size**2)
    sized = bind_images({"images": [png(width, height)], "messages": user(IMAGE, TEXT)}, None, policy)
    image = message_images(sized["messages"])[0]
    assert policy.tokens(image) == own
    # sized once: the processor, given the sized image, resizes nothing and makes as many tokens
    again = processor(images=[image], return_tensors="pt")["image_grid_thw"]
    assert int(again.prod() // processor.merge_size**2) == own


def test_images_come_as_paths_base64_data_uris_bytes_and_datasets_dicts_alike(tmp_path, policy):
    data = png(56, 84)
    (tmp_path / "pictures").mkdir()
    (tmp_path / "pictures" / "a.png").write_bytes(data)
    b64 = base64.b64encode(data).decode()
    forms = ["pictures/a.png", str(tmp_path / "pictures" / "a.png"), b64, f"data:image/png;base64,{b64}", data,
             {"bytes": data, "path": None}, {"bytes": None, "path": str(tmp_path / "pictures" / "a.png")}]
    arrays = [message_images(bind_images({"image": form, "prompt": user(IMAGE, TEXT)}, tmp_path, policy)["prompt"])[0]
              for form in forms]
    assert all(a.dtype == np.uint8 and a.shape == (84, 56, 3) and np.array_equal(a, arrays[0]) for a in arrays)


def test_a_completion_after_an_explicit_prompt_numbers_its_image_parts_after_the_prompts(policy):
    record = {"images": [png(56, 56, 1), png(56, 56, 2)], "prompt": user(IMAGE, TEXT),
              "chosen": [{"role": "assistant", "content": "x"}, *user(IMAGE)], "rejected": "y"}
    bound = bind_images(record, None, policy)
    first, second = message_images(bound["prompt"])[0], message_images(bound["chosen"])[0]
    assert not np.array_equal(first, second)
    with pytest.raises(ValueError, match="1 image part.*for 2 image"):
        bind_images({**record, "chosen": "x"}, None, policy)


@pytest.mark.parametrize("images, parts, reason", [
    (["no/such.png"], [IMAGE], "image 0: no such file"),
    ([base64.b64encode(b"not an image").decode()], [IMAGE], "image 0: not a decodable image"),
    ([png(56, 56), png(56, 56)], [IMAGE], "1 image part.*for 2 image"),
    ([png(56, 56)], [IMAGE, IMAGE], "more image parts"),
    ([png(10, 2500)], [IMAGE], "image 0: 10x2500.*aspect ratio"),
    ("a.png", [IMAGE], "field 'images' must be a list"),
])
def test_bad_images_are_refused_with_their_reason(tmp_path, policy, images, parts, reason):
    with pytest.raises(ValueError, match=reason):
        bind_images({"images": images, "messages": user(*parts)}, tmp_path, policy)


def test_an_image_too_large_to_decode_is_refused(tmp_path, policy, monkeypatch):
    monkeypatch.setattr("oxrl_core.data.images.MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(ValueError, match="56x56 pixels is too large"):
        bind_images({"images": [png(56, 56)], "messages": user(IMAGE)}, tmp_path, policy)


def test_a_text_model_refuses_a_record_with_images(tiny_model_dir):
    text_tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert image_policy(text_tokenizer) is None
    with pytest.raises(ValueError, match="not a vision-language model"):
        bind_images({"images": [png(56, 56)], "messages": user(IMAGE)}, None, image_policy(text_tokenizer))


def test_placeholders_expand_to_each_images_tokens_and_collapse_back(policy):
    images = [np.zeros((56, 84, 3), np.uint8), np.zeros((28, 28, 3), np.uint8)]
    pad = policy.token_id
    ids = [105, pad, 106, 107, pad, 108]
    expanded = expand_image_tokens(ids, images, policy)
    assert expanded == [105, pad, pad, pad, pad, pad, pad, 106, 107, pad, 108]  # 2 x 3 tokens, then 1 x 1
    assert collapse_image_tokens(expanded, pad) == ids
    with pytest.raises(ValueError, match="rendered 2 image placeholder"):
        expand_image_tokens(ids, images[:1], policy)


def write(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_sft_records_with_images_train_on_the_answer_only_and_bad_ones_are_reported_by_line(tmp_path, tokenizer, policy):
    good = vlm_sft_records(square_images(3, seed=0), wrong_share=0.0, seed=0)
    bad = [{**good[0], "images": ["missing.png"]}, {**good[0], "images": []}]
    examples, report = load_sft_examples(write(tmp_path / "sft.jsonl", good + bad), tokenizer, 128, strict=False)
    assert report.kept == 3 and [(p.line, p.reason.split(":")[0]) for p in report.problems] == [(4, "image 0"), (5, "more image parts ({\"type\"")]
    for example in examples:
        ids, mask = example.input_ids, example.target_mask
        image_positions = [i for i, t in enumerate(ids) if t == policy.token_id]
        assert len(image_positions) == policy.tokens(example.images[0]) == 4  # a 56 x 56 image: 2 x 2 tokens
        assert all(mask[i] == 0 for i in image_positions)
        assert tokenizer.decode([t for t, m in zip(ids, mask) if m]).startswith("<answer>")
    with pytest.raises(OxrlError, match=r"sft.jsonl:4: image 0"):
        load_sft_examples(tmp_path / "sft.jsonl", tokenizer, 128, strict=True)


def test_truncation_that_would_cut_image_tokens_refuses_the_record(tmp_path, tokenizer):
    record = vlm_sft_records(square_images(1, seed=0), 0.0, 0)[0]
    record["images"] = [base64.b64encode(png(448, 448)).decode()]  # 256 image tokens
    with pytest.raises(OxrlError, match="image tokens run to token .*data.max_len=128 would cut them"):
        load_sft_examples(write(tmp_path / "long.jsonl", [record]), tokenizer, 128, strict=False)


def test_chosen_and_rejected_rows_share_the_prompts_image(tmp_path, tokenizer):
    pairs, _ = load_preference_examples(write(tmp_path / "pref.jsonl", vlm_preference_records(square_images(2, 0), 0)),
                                        tokenizer, 128, strict=True)
    batch = collate_pairs(pairs, tokenizer.pad_token_id)
    assert batch["image_counts"].tolist() == [1, 1, 1, 1]
    images = batch["images"]  # rows: chosen 0, chosen 1, rejected 0, rejected 1
    assert images[0] is images[2] and images[1] is images[3] and not np.array_equal(images[0], images[1])


def test_the_model_reads_a_rows_image_tokens_as_images_and_a_sampled_placeholder_after_them_as_text(
        tmp_path, tiny_vl_model_dir, tokenizer, policy):
    prompts, _ = load_prompts(write(tmp_path / "rl.jsonl", [
        {"images": [base64.b64encode(png(56, 84)).decode()], "prompt": user(IMAGE, TEXT)}]), tokenizer, 64, strict=True)
    prompt = prompts[0]
    from oxrl_core.data.sft import SFTExample

    sampled = [107, policy.token_id]  # the policy sampled a placeholder: the engine stops there
    example = SFTExample(prompt.prompt_ids + sampled, [0] * len(prompt.prompt_ids) + [1, 1], prompt.images)
    text_only = SFTExample([103, 104, 105], [0, 1, 1])
    batch = collate_sft([example, text_only], tokenizer.pad_token_id)
    inputs = vision_inputs(batch, AutoImageProcessor.from_pretrained(tiny_vl_model_dir), policy.token_id)
    types, ids = inputs["mm_token_type_ids"], batch["input_ids"]
    assert types[0].sum() == 6 and types[1].sum() == 0 and inputs["image_grid_thw"].tolist() == [[1, 6, 4]]
    assert (ids[0][types[0] == 1] == policy.token_id).all()
    last = len(example.input_ids) - 1
    assert ids[0, last] == policy.token_id and inputs["model_input_ids"][0, last] == 0 and types[0, last] == 0
    assert torch.equal(inputs["model_input_ids"][0, :last], ids[0, :last])
