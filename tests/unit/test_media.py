"""Media as a data concern: reading and preparing a record's images and audio clips, binding them to their parts, the
media tokens in the ids, and what the trainer's model reads of them."""

import base64
import io
import json

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

from oxrl_core.data.media import bind_media, collapse_media_tokens, expand_media_tokens, media_policy, message_media
from oxrl_core.data.preference import collate_pairs, load_preference_examples
from oxrl_core.data.records import load_prompts, load_sft_examples
from oxrl_core.data.sft import collate_sft
from oxrl_core.errors import OxrlError
from oxrl_core.preprocess.counting import preference_records, sft_records, square_images


@pytest.fixture(scope="module")
def tokenizer(tiny_vl_model_dir):
    return AutoTokenizer.from_pretrained(tiny_vl_model_dir)


@pytest.fixture(scope="module")
def policy(tokenizer):
    return media_policy(tokenizer.name_or_path)


def png(width: int, height: int, seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def user(*parts) -> list[dict]:
    return [{"role": "user", "content": list(parts)}]


IMAGE, TEXT = {"type": "image"}, {"type": "text", "text": "How many?"}


@pytest.mark.parametrize("width, height", [(56, 56), (30, 40), (500, 120), (13, 300), (1000, 1000), (60, 29)])
def test_sizing_gives_the_token_count_the_models_own_processor_gives_the_raw_image(
    tiny_vl_model_dir, policy, width, height
):
    processor = AutoImageProcessor.from_pretrained(tiny_vl_model_dir)
    raw = Image.open(io.BytesIO(png(width, height)))
    own = int(processor(images=[raw], return_tensors="pt")["image_grid_thw"].prod() // processor.merge_size**2)
    sized = bind_media({"images": [png(width, height)], "messages": user(IMAGE, TEXT)}, None, policy)
    image = message_media(sized["messages"])[0]
    assert policy.media_tokens(image) == own
    # sized once: the processor, given the sized image, resizes nothing and makes as many tokens
    again = processor(images=[image], return_tensors="pt")["image_grid_thw"]
    assert int(again.prod() // processor.merge_size**2) == own


def bound_forms(tmp_path, data: bytes, kind: str, mime: str, policy) -> list[np.ndarray]:
    """The item `data` bound from each form a record may give it in: a path relative to the data file's folder, an
    absolute path, base64, a data URL, raw bytes, and `datasets`' dict with bytes or with a path."""
    path = tmp_path / "media" / f"a.{mime}"
    path.parent.mkdir()
    path.write_bytes(data)
    b64 = base64.b64encode(data).decode()
    forms = [
        f"media/a.{mime}",
        str(path),
        b64,
        f"data:{kind}/{mime};base64,{b64}",
        data,
        {"bytes": data, "path": None},
        {"bytes": None, "path": str(path)},
    ]
    return [
        message_media(bind_media({kind: form, "prompt": user({"type": kind}, TEXT)}, tmp_path, policy)["prompt"])[0]
        for form in forms
    ]


def test_images_come_as_paths_base64_data_uris_bytes_and_datasets_dicts_alike(tmp_path, policy):
    arrays = bound_forms(tmp_path, png(56, 84), "image", "png", policy)
    assert all(a.dtype == np.uint8 and a.shape == (84, 56, 3) and np.array_equal(a, arrays[0]) for a in arrays)


def test_a_completion_after_an_explicit_prompt_numbers_its_image_parts_after_the_prompts(policy):
    record = {
        "images": [png(56, 56, 1), png(56, 56, 2)],
        "prompt": user(IMAGE, TEXT),
        "chosen": [{"role": "assistant", "content": "x"}, *user(IMAGE)],
        "rejected": "y",
    }
    bound = bind_media(record, None, policy)
    first, second = message_media(bound["prompt"])[0], message_media(bound["chosen"])[0]
    assert not np.array_equal(first, second)
    with pytest.raises(ValueError, match="1 image part.*for 2 image"):
        bind_media({**record, "chosen": "x"}, None, policy)


@pytest.mark.parametrize(
    "images, parts, reason",
    [
        (["no/such.png"], [IMAGE], "image 0: no such file"),
        ([base64.b64encode(b"not an image").decode()], [IMAGE], "image 0: not a decodable image"),
        ([png(56, 56), png(56, 56)], [IMAGE], "1 image part.*for 2 image"),
        ([png(56, 56)], [IMAGE, IMAGE], "more image parts"),
        ([png(10, 2500)], [IMAGE], "image 0: 10x2500.*aspect ratio"),
        ("a.png", [IMAGE], "field 'images' must be a list"),
    ],
)
def test_bad_images_are_refused_with_their_reason(tmp_path, policy, images, parts, reason):
    with pytest.raises(ValueError, match=reason):
        bind_media({"images": images, "messages": user(*parts)}, tmp_path, policy)


def test_an_image_too_large_to_decode_is_refused(tmp_path, policy, monkeypatch):
    monkeypatch.setattr("oxrl_core.data.images.MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(ValueError, match="56x56 pixels is too large"):
        bind_media({"images": [png(56, 56)], "messages": user(IMAGE)}, tmp_path, policy)


def test_a_text_model_refuses_a_record_with_images(tiny_model_dir):
    text_tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert media_policy(text_tokenizer.name_or_path) is None
    with pytest.raises(ValueError, match="the model takes none"):
        bind_media({"images": [png(56, 56)], "messages": user(IMAGE)}, None, media_policy(text_tokenizer.name_or_path))


def test_placeholders_expand_to_each_images_tokens_and_collapse_back(policy):
    images = [np.zeros((56, 84, 3), np.uint8), np.zeros((56, 56, 3), np.uint8)]  # sized (policy.prepare)
    pad = policy.token_id
    ids = [105, pad, 106, 107, pad, 108]
    expanded = expand_media_tokens(ids, images, policy)
    assert expanded == [105, *[pad] * 6, 106, 107, *[pad] * 4, 108]  # 2 x 3 tokens, then 2 x 2
    assert collapse_media_tokens(expanded, images, policy) == ids
    with pytest.raises(ValueError, match=r"rendered 2 placeholder\(s\) <\|image_pad\|> for 1 image"):
        expand_media_tokens(ids, images[:1], policy)


def write(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_sft_records_with_images_train_on_the_answer_only_and_bad_ones_are_reported_by_line(
    tmp_path, tokenizer, policy
):
    good = sft_records(square_images(3, seed=0), wrong_share=0.0, seed=0)
    bad = [{**good[0], "images": ["missing.png"]}, {**good[0], "images": []}]
    examples, report = load_sft_examples(write(tmp_path / "sft.jsonl", good + bad), tokenizer, 128, strict=False)
    assert report.kept == 3 and [(p.line, p.reason.split(":")[0]) for p in report.problems] == [
        (4, "image 0"),
        (5, 'more image parts ({"type"'),
    ]
    for example in examples:
        ids, mask = example.input_ids, example.target_mask
        image_positions = [i for i, t in enumerate(ids) if t == policy.token_id]
        assert len(image_positions) == policy.media_tokens(example.media[0]) == 4  # a 56 x 56 image: 2 x 2 tokens
        assert all(mask[i] == 0 for i in image_positions)
        assert tokenizer.decode([t for t, m in zip(ids, mask) if m]).startswith("<answer>")
    with pytest.raises(OxrlError, match=r"sft.jsonl:4: image 0"):
        load_sft_examples(tmp_path / "sft.jsonl", tokenizer, 128, strict=True)


def test_truncation_that_would_cut_image_tokens_refuses_the_record(tmp_path, tokenizer):
    record = sft_records(square_images(1, seed=0), 0.0, 0)[0]
    record["images"] = [base64.b64encode(png(448, 448)).decode()]  # 256 image tokens
    with pytest.raises(OxrlError, match="media tokens run to token .*data.max_len=128 would cut them"):
        load_sft_examples(write(tmp_path / "long.jsonl", [record]), tokenizer, 128, strict=False)


def test_chosen_and_rejected_rows_share_the_prompts_image(tmp_path, tokenizer):
    pairs, _ = load_preference_examples(
        write(tmp_path / "pref.jsonl", preference_records(square_images(2, 0), 0)), tokenizer, 128, strict=True
    )
    batch = collate_pairs(pairs, tokenizer.pad_token_id)
    assert batch["media_counts"].tolist() == [1, 1, 1, 1]
    images = batch["media"]  # rows: chosen 0, chosen 1, rejected 0, rejected 1
    assert images[0] is images[2] and images[1] is images[3] and not np.array_equal(images[0], images[1])


def test_the_model_reads_a_rows_image_tokens_as_images_and_a_sampled_placeholder_after_them_as_text(
    tmp_path, tiny_vl_model_dir, tokenizer, policy
):
    prompts, _ = load_prompts(
        write(
            tmp_path / "rl.jsonl", [{"images": [base64.b64encode(png(56, 84)).decode()], "prompt": user(IMAGE, TEXT)}]
        ),
        tokenizer,
        64,
        strict=True,
    )
    prompt = prompts[0]
    from oxrl_core.data.sft import SFTExample

    sampled = [107, policy.token_id]  # the policy sampled a placeholder: the engine stops there
    example = SFTExample(prompt.prompt_ids + sampled, [0] * len(prompt.prompt_ids) + [1, 1], prompt.media)
    text_only = SFTExample([103, 104, 105], [0, 1, 1])
    batch = collate_sft([example, text_only], tokenizer.pad_token_id)
    inputs = policy.model_inputs(batch["input_ids"], batch["media"], batch["media_counts"].tolist())
    types, ids = inputs["mm_token_type_ids"], batch["input_ids"]
    assert types[0].sum() == 6 and types[1].sum() == 0 and inputs["image_grid_thw"].tolist() == [[1, 6, 4]]
    assert (ids[0][types[0] == 1] == policy.token_id).all()
    last = len(example.input_ids) - 1
    assert ids[0, last] == policy.token_id and inputs["input_ids"][0, last] == 0 and types[0, last] == 0
    assert torch.equal(inputs["input_ids"][0, :last], ids[0, :last])


def wav(seconds: float, rate: int = 8000, channels: int = 1, pitch: float = 440.0) -> bytes:
    import soundfile

    t = np.arange(int(seconds * rate)) / rate
    samples = np.repeat((0.5 * np.sin(2 * np.pi * pitch * t))[:, None], channels, axis=1)
    out = io.BytesIO()
    soundfile.write(out, samples, rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


AUDIO = {"type": "audio"}


@pytest.fixture(scope="module")
def audio_policy(tiny_audio_model_dir):
    return media_policy(str(tiny_audio_model_dir))


@pytest.mark.parametrize(
    "family, kind",
    [
        ("tiny_vl_model_dir", "image"),
        ("tiny_qwen3_vl_model_dir", "image"),
        ("tiny_smolvlm_model_dir", "image"),
        ("tiny_audio_model_dir", "audio"),
    ],
)
def test_each_family_reads_the_ids_and_encoder_inputs_its_own_processor_makes_from_the_rendered_conversation(
    request, tmp_path, family, kind
):
    """What the trainer reads of a record (its ids: placeholders expanded per item; its encoder inputs) is what the
    model's own processor makes of the rendered conversation and the item: Qwen-VL's image tokens, Idefics3's tiles
    with their row and column tokens, Qwen2-Audio's audio tokens and mel features."""
    from oxrl_core.data.sft import tokenize_sft

    folder = str(request.getfixturevalue(family))
    tokenizer, policy, processor = (
        AutoTokenizer.from_pretrained(folder),
        media_policy(folder),
        AutoProcessor.from_pretrained(folder),
    )
    items = [png(70, 50), png(56, 56, 1)] if kind == "image" else [wav(0.7), wav(1.3, 22050, 2, 880.0)]
    messages = [
        {"role": "user", "content": [{"type": kind}, TEXT, {"type": kind}]},
        {"role": "assistant", "content": "3"},
    ]
    bound = bind_media({f"{kind}s": items, "messages": messages}, tmp_path, policy)
    example = tokenize_sft(bound["messages"], tokenizer, 1024)
    media = list(example.media)
    text = processor.apply_chat_template(messages, tokenize=False)
    if kind == "image":
        own = processor(text=[text], images=media, return_tensors="pt", add_special_tokens=False)
    else:
        own = processor(text=[text], audio=media, sampling_rate=16000, return_tensors="pt", add_special_tokens=False)
    assert example.input_ids == own["input_ids"][0].tolist()
    inputs = policy.model_inputs(torch.tensor([example.input_ids]), media, [2])
    for name, value in inputs.items():
        if name == "feature_attention_mask":  # the extractor's, under the name the model takes
            assert torch.equal(value, own["feature_attention_mask"])
        elif name in own:
            assert torch.equal(value.reshape(own[name].shape), own[name]), name
    assert collapse_media_tokens(example.input_ids, tuple(media), policy) == tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=False
    )


def test_audio_comes_as_paths_base64_data_urls_bytes_and_datasets_dicts_alike_resampled_and_capped(
    tmp_path, audio_policy
):
    clips = bound_forms(tmp_path, wav(0.5, rate=8000), "audio", "wav", audio_policy)
    assert all(c.dtype == np.float32 and c.shape == (8000,) and np.array_equal(c, clips[0]) for c in clips)  # 16 kHz
    # a 440 Hz tone stays a 440 Hz tone: its spectrum peaks there
    assert abs(np.argmax(np.abs(np.fft.rfft(clips[0]))) * 16000 / len(clips[0]) - 440) < 5
    long = bind_media({"audios": [wav(31.0)], "messages": user(AUDIO)}, tmp_path, audio_policy)
    assert message_media(long["messages"])[0].shape == (30 * 16000,)  # the model hears 30 s: no more is kept


def absurd_wav(rate: int = 8000, channels: int = 1, data_bytes: int = 2**32 - 1) -> bytes:
    """A WAV header promising `data_bytes` of samples (4 GB: hours), followed by 100 of them."""
    import struct

    header = struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        (36 + data_bytes) & 0xFFFFFFFF,
        b"WAVE",
        b"fmt ",
        16,
        1,
        channels,
        rate,
        (rate * channels * 2) & 0xFFFFFFFF,
        channels * 2,
        16,
        b"data",
        data_bytes,
    )
    return header + bytes(200)


def test_bad_audio_is_reported_by_file_and_line_and_skipped_with_memory_bounded(tmp_path, tiny_audio_model_dir):
    """Missing, empty, truncated, not audio, an absurd header (a rate or channel count no recording has) and a path
    that cannot be read: each skipped with its line and reason, the good records kept. A header promising hours is
    not believed: what the file holds is read, and decoding them all allocates no more than a few clips' worth."""
    import tracemalloc

    tokenizer = AutoTokenizer.from_pretrained(tiny_audio_model_dir)
    (tmp_path / "empty.wav").write_bytes(b"")
    (tmp_path / "folder.wav").mkdir()  # a path that is there but cannot be read as a file
    clips = [
        wav(0.5),
        "missing.wav",
        "empty.wav",
        wav(1.0)[:30],
        base64.b64encode(b"RIFF not a wave at all").decode(),
        absurd_wav(),
        absurd_wav(rate=4_000_000_000),
        absurd_wav(channels=4000),
        "folder.wav",
        wav(0.8),
    ]
    records = [
        {"audios": [clip], "messages": user(AUDIO, TEXT) + [{"role": "assistant", "content": "1"}]} for clip in clips
    ]
    tracemalloc.start()
    try:
        examples, report = load_sft_examples(
            write(
                tmp_path / "clips.jsonl",
                [
                    {**r, "audios": [base64.b64encode(c).decode() if isinstance(c, bytes) else c]}
                    for r, c in zip(records, clips)
                ],
            ),
            tokenizer,
            1024,
            strict=False,
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert report.kept == 3 and len(examples) == 3
    reasons = {p.line: p.reason for p in report.problems}
    assert sorted(reasons) == [2, 3, 4, 5, 7, 8, 9]
    assert "no such file" in reasons[2] and "no such file" in reasons[9]
    assert all("not decodable audio" in reasons[line] for line in (3, 4, 5, 7, 8)), reasons
    # the header promising hours: read for what it holds, 100 samples at 8 kHz (200 at the model's 16 kHz)
    assert [len(e.media[0]) for e in examples] == [8000, 200, 12800]
    assert all(str(tmp_path / "clips.jsonl") == p.path for p in report.problems)
    assert peak < 64 * 2**20  # 4 GB promised; a clip is at most 30 s of float32 (1.9 MB)
