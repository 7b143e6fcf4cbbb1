"""Preference, unpaired (KTO) and CPT data: record shapes, completion-only masks, the KL rotation, packing, bad records."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoTokenizer

from oxrl_core.data.preference import (
    collate_pairs,
    load_preference_examples,
    load_text_blocks,
    load_unpaired_examples,
    preference_pair,
)
from oxrl_core.data.sft import tokenize_completion, tokenize_sft
from oxrl_core.errors import OxrlError

LONG_PROMPT = "word " * 60  # longer than the max_len of 32 used below


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def masked_text(tokenizer, example) -> str:
    return tokenizer.decode([t for t, m in zip(example.input_ids, example.target_mask) if m])


def write_jsonl(path, lines: list) -> None:
    """One line per item: dicts as JSON, strings verbatim (for malformed lines)."""
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))


def chatml(*turns: tuple[str, str]) -> str:
    return "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in turns)


def user(content):
    return {"role": "user", "content": content}


def assistant(content):
    return {"role": "assistant", "content": content}


# tokenize_completion


def test_completion_mask_skips_assistant_turns_inside_the_prompt(tokenizer):
    prompt = [{"role": "system", "content": "Be brief."}, user("1 + 1?"), assistant("two"), user("2 + 2?")]
    example = tokenize_completion(prompt, [assistant("four")], tokenizer, 256)
    assert masked_text(tokenizer, example) == "four<|im_end|>\n"
    assert tokenizer.decode(example.input_ids) == chatml(
        ("system", "Be brief."), ("user", "1 + 1?"), ("assistant", "two"), ("user", "2 + 2?"), ("assistant", "four")
    )
    # the same tokens as SFT on the whole conversation, which also trains the earlier assistant turn
    sft = tokenize_sft(prompt + [assistant("four")], tokenizer, 256)
    assert sft.input_ids == example.input_ids and masked_text(tokenizer, sft) == "two<|im_end|>\nfour<|im_end|>\n"


def test_completion_is_truncated_but_a_prompt_that_fills_max_len_is_an_error(tokenizer):
    full = tokenize_completion([user("hi")], [assistant("a long answer " * 10)], tokenizer, 512)
    cut = tokenize_completion([user("hi")], [assistant("a long answer " * 10)], tokenizer, 20)
    assert cut.input_ids == full.input_ids[:20] and cut.target_mask == full.target_mask[:20] and 1 in cut.target_mask
    with pytest.raises(ValueError, match=r"^prompt is \d+ tokens; with data.max_len=32 no response token is left$"):
        tokenize_completion([user(LONG_PROMPT)], [assistant("ok")], tokenizer, 32)


@pytest.mark.parametrize(
    "prompt, completion, reason",
    [
        ([user("hi")], [assistant("  ")], "empty completion: no assistant message with content"),
        ([user("hi")], [user("more")], "empty completion: no assistant message with content"),
        ([], [assistant("ok")], "empty prompt: no message before the completion"),
    ],
)
def test_completion_without_content_or_prompt_is_an_error(tokenizer, prompt, completion, reason):
    with pytest.raises(ValueError, match=f"^{reason}$"):
        tokenize_completion(prompt, completion, tokenizer, 64)


# preference pairs


def test_pair_masks_cover_exactly_each_completion(tokenizer):
    pair = preference_pair({"prompt": "What is 2 + 3?", "chosen": "<answer>5</answer>", "rejected": "6"}, tokenizer, 64)
    assert tokenizer.decode(pair.chosen.input_ids) == chatml(
        ("user", "What is 2 + 3?"), ("assistant", "<answer>5</answer>")
    )
    assert tokenizer.decode(pair.rejected.input_ids) == chatml(("user", "What is 2 + 3?"), ("assistant", "6"))
    assert masked_text(tokenizer, pair.chosen) == "<answer>5</answer><|im_end|>\n"
    assert masked_text(tokenizer, pair.rejected) == "6<|im_end|>\n"
    assert pair.margin == 0.0


def test_implicit_prompt_gives_the_same_tokens_as_the_explicit_form(tokenizer):
    system = {"role": "system", "content": "Be brief."}
    prompt = [system, user("1 + 1?"), assistant("two"), user("2 + 2?")]
    implicit = preference_pair(
        {"chosen": prompt + [assistant("four")], "rejected": prompt + [assistant("five")]}, tokenizer, 128
    )
    explicit = preference_pair(
        {"prompt": prompt, "chosen": [assistant("four")], "rejected": [assistant("five")]}, tokenizer, 128
    )
    assert implicit == explicit
    assert masked_text(tokenizer, implicit.chosen) == "four<|im_end|>\n"  # not "two": it is in the shared prompt
    strings = preference_pair({"prompt": "hi", "chosen": "yes", "rejected": "no"}, tokenizer, 64)
    assert (
        preference_pair(
            {"chosen": [user("hi"), assistant("yes")], "rejected": [user("hi"), assistant("no")]}, tokenizer, 64
        )
        == strings
    )


def test_identical_chosen_and_rejected_are_kept_in_both_forms(tokenizer):
    conversation = [user("hi"), assistant("yes")]
    implicit = preference_pair({"chosen": conversation, "rejected": conversation}, tokenizer, 64)
    explicit = preference_pair({"prompt": "hi", "chosen": "yes", "rejected": "yes"}, tokenizer, 64)
    assert implicit == explicit and implicit.chosen == implicit.rejected
    assert masked_text(tokenizer, implicit.chosen) == "yes<|im_end|>\n"


def test_bad_preference_records_are_skipped_with_line_and_reason(tmp_path, tokenizer):
    path = tmp_path / "pairs.jsonl"
    write_jsonl(
        path,
        [
            {"prompt": "hi", "chosen": "yes", "rejected": "no", "margin": 1.5},  # 1
            "{broken",  # 2
            {"prompt": "hi", "chosen": "yes"},  # 3
            {"prompt": 3, "chosen": "yes", "rejected": "no"},  # 4
            {"prompt": "hi", "chosen": " ", "rejected": "no"},  # 5
            {"chosen": [user("a"), assistant("b")], "rejected": [user("c"), assistant("d")]},  # 6
            {"chosen": "yes", "rejected": "no"},  # 7
            {"prompt": "hi", "chosen": "yes", "rejected": "no", "margin": "big"},  # 8
            {"prompt": LONG_PROMPT, "chosen": "yes", "rejected": "no"},  # 9
            {
                "chosen": [user("a"), assistant("b"), user("c"), assistant("d")],
                "rejected": [user("a"), assistant("b"), user("e"), assistant("f")],
            },  # 10
            {"prompt": "hi", "chosen": [user("yes")], "rejected": "no"},  # 11
            {"prompt": "hi", "chosen": "yes", "rejected": [{"role": "robot", "content": "x"}]},  # 12
            {
                "chosen": [user("a"), assistant("b")],
                "rejected": [user("a"), assistant("b"), user("c"), assistant("d")],
            },  # 13
            {"prompt": "hi", "chosen": "yes", "rejected": "no", "margin": True},  # 14
            {"prompt": [user("hi")], "chosen": [assistant("yes")], "rejected": [assistant("no")]},  # 15
        ],
    )
    pairs, report = load_preference_examples(path, tokenizer, 32, strict=False)
    assert report.total == 15 and report.kept == len(pairs) == 2
    assert pairs[0].margin == 1.5 and pairs[1].margin == 0.0 and pairs[0].chosen == pairs[1].chosen
    reasons = [(p.line, p.reason) for p in report.problems]
    assert [line for line, _ in reasons] == [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    reason = dict(reasons)
    assert reason[2].startswith("malformed JSON")
    assert reason[3].startswith("missing field 'rejected' (a preference record needs 'chosen' and 'rejected'")
    assert reason[4] == "field 'prompt' must be a string or a list of messages, got int"
    assert reason[5] == "empty completion in 'chosen': no assistant message with content"
    assert reason[6].startswith("no shared prompt: without a 'prompt' field")
    assert reason[7].startswith("without a 'prompt' field, 'chosen' must be a whole conversation") and reason[
        7
    ].endswith("got str")
    assert reason[8] == "field 'margin' must be a finite number, got 'big'"
    assert reason[9].startswith("prompt is ") and reason[9].endswith("with data.max_len=32 no response token is left")
    assert reason[10] == (
        "the completion in 'chosen' (what follows the prompt) must start with an assistant message, got a user message"
    )
    assert reason[11] == "empty completion in 'chosen': no assistant message with content"
    assert reason[12].startswith("message 0 must be {role: one of")
    assert reason[13] == "empty completion in 'chosen': no assistant message with content"  # chosen is all prompt
    assert reason[14] == "field 'margin' must be a finite number, got True"


def test_preference_parquet_rows_with_null_columns(tmp_path, tokenizer):
    path = tmp_path / "pairs.parquet"
    rows = [
        {"prompt": "hi", "chosen": "yes", "rejected": "no", "margin": 2.0},
        {"prompt": "hi", "chosen": "yes", "rejected": ""},
        {"prompt": "hey", "chosen": "sure", "rejected": "nope"},
        {"prompt": "hi", "chosen": "yes"},
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)  # absent fields become nulls in their column
    pairs, report = load_preference_examples(path, tokenizer, 64, strict=False)
    assert [p.margin for p in pairs] == [2.0, 0.0]
    assert masked_text(tokenizer, pairs[1].chosen) == "sure<|im_end|>\n"
    assert [(p.line, p.reason.split(" (")[0]) for p in report.problems] == [
        (2, "empty completion in 'rejected': no assistant message with content"),
        (4, "missing field 'rejected'"),
    ]


def test_preference_loader_needs_a_chat_template_and_strict_stops_at_the_first_bad_line(tmp_path, tiny_model_dir):
    path = tmp_path / "pairs.jsonl"
    write_jsonl(path, [{"prompt": "hi", "chosen": "yes", "rejected": "no"}, {"prompt": "hi"}])
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    with pytest.raises(OxrlError, match=rf"{path}:2: missing field 'chosen'.*--strict"):
        load_preference_examples(path, tokenizer, 64, strict=True)
    tokenizer.chat_template = None
    with pytest.raises(OxrlError, match="no chat template; preference records"):
        load_preference_examples(path, tokenizer, 64, strict=False)


def test_collate_pairs_puts_chosen_rows_first_then_rejected_rows_and_the_margins(tokenizer):
    pairs = [
        preference_pair({"prompt": "hi", "chosen": "yes", "rejected": "no", "margin": 0.5}, tokenizer, 64),
        preference_pair(
            {"prompt": "What is 40 + 2?", "chosen": "<answer>42</answer>", "rejected": "41"}, tokenizer, 64
        ),
    ]
    batch = collate_pairs(pairs, pad_id=tokenizer.pad_token_id)
    ids, attention, mask = batch["input_ids"], batch["attention_mask"], batch["response_mask"]
    assert ids.shape[0] == attention.shape[0] == mask.shape[0] == 4 and mask.shape[1] == ids.shape[1] - 1
    rows = [pairs[0].chosen, pairs[1].chosen, pairs[0].rejected, pairs[1].rejected]
    for b, example in enumerate(rows):
        n = len(example.input_ids)
        assert ids[b, :n].tolist() == example.input_ids and attention[b].sum() == n
        predicted = [ids[b, t + 1].item() for t in range(mask.shape[1]) if mask[b, t]]
        assert predicted == [tok for tok, m in zip(example.input_ids, example.target_mask) if m]
    assert batch["margin"].tolist() == [0.5, 0.0] and batch["margin"].dtype == torch.float32


# unpaired (KTO)


def test_mismatched_example_pairs_each_prompt_with_the_next_usable_records_completion(tmp_path, tokenizer):
    path = tmp_path / "kto.jsonl"
    write_jsonl(
        path,
        [
            {"prompt": "p0", "completion": "c0", "label": True},  # 1
            {"prompt": "p1", "completion": "c1", "label": "1"},  # 2
            {"prompt": [user("p2")], "completion": [assistant("c2")], "label": False},  # 3
            {"prompt": "p3", "completion": "c3", "label": 1},  # 4
            {"prompt": "p4", "completion": "c4"},  # 5
            {"prompt": "p5", "completion": "", "label": True},  # 6
            {"prompt": LONG_PROMPT, "completion": "c6", "label": True},  # 7
            "[1]",  # 8
            {"prompt": "p8", "completion": "c8", "label": False},  # 9
        ],
    )
    examples, report = load_unpaired_examples(path, tokenizer, 32, strict=False)
    assert report.total == 9 and report.kept == 3
    assert [e.desirable for e in examples] == [True, False, False]
    kept = ["0", "2", "8"]
    for i, e in enumerate(examples):
        this, following = kept[i], kept[(i + 1) % 3]
        assert tokenizer.decode(e.example.input_ids) == chatml(("user", f"p{this}"), ("assistant", f"c{this}"))
        assert masked_text(tokenizer, e.example) == f"c{this}<|im_end|>\n"
        assert tokenizer.decode(e.mismatched.input_ids) == chatml(("user", f"p{this}"), ("assistant", f"c{following}"))
        assert masked_text(tokenizer, e.mismatched) == f"c{following}<|im_end|>\n"
    reason = {p.line: p.reason for p in report.problems}
    assert reason.keys() == {2, 4, 5, 6, 7, 8}
    assert reason[2] == "field 'label' must be true or false (a JSON boolean), got '1'"
    assert reason[4] == "field 'label' must be true or false (a JSON boolean), got 1"
    assert reason[5].startswith("missing field 'label' (an unpaired record needs 'prompt', 'completion' and 'label'")
    assert reason[6] == "empty completion in 'completion': no assistant message with content"
    assert reason[7].startswith("prompt is ") and reason[7].endswith("no response token is left")
    assert reason[8] == "expected a JSON object, got list"


def test_kto_needs_two_usable_records_but_accepts_a_single_label(tmp_path, tokenizer):
    path = tmp_path / "kto.jsonl"
    write_jsonl(path, [{"prompt": "p", "completion": "c", "label": True}, {"prompt": "p", "label": True}])
    with pytest.raises(OxrlError, match="1 usable unpaired record; KTO needs at least 2"):
        load_unpaired_examples(path, tokenizer, 64, strict=False)
    write_jsonl(
        path, [{"prompt": "p", "completion": "c", "label": True}, {"prompt": "q", "completion": "d", "label": True}]
    )
    examples, _ = load_unpaired_examples(path, tokenizer, 64, strict=False)
    assert [e.desirable for e in examples] == [True, True]
    assert examples[0].mismatched == tokenize_completion([user("p")], [assistant("d")], tokenizer, 64)
    assert examples[1].mismatched == tokenize_completion([user("q")], [assistant("c")], tokenizer, 64)


# CPT


def test_text_blocks_pack_every_document_and_its_eos_in_order(tmp_path, tokenizer):
    path = tmp_path / "text.jsonl"
    texts = [
        "The cat sat on the mat.",
        "What is 2 + 3? It is 5.",
        "short",
        "A last document, a little longer than the rest.",
    ]
    write_jsonl(
        path,
        [
            {"text": texts[0]},
            {"txt": "x"},
            {"text": texts[1]},
            {"text": 7},
            "{oops",
            {"text": "  \n"},
            {"text": texts[2]},
            {"text": texts[3]},
        ],
    )
    expected = []
    for text in texts:
        expected += tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]
    assert tokenizer.decode(expected) == "<|im_end|>".join(texts) + "<|im_end|>"

    blocks, report = load_text_blocks(path, tokenizer, 8, strict=False)
    assert report.total == 8 and report.kept == 4  # records, not blocks
    assert [p.line for p in report.problems] == [2, 4, 5, 6]
    reason = {p.line: p.reason for p in report.problems}
    assert reason[2] == "missing field 'text' (a CPT record is {\"text\": string})"
    assert reason[4] == "field 'text' must be a string, got int" and reason[6] == "empty text"
    assert [t for b in blocks for t in b.input_ids] == expected  # nothing lost, duplicated or reordered
    assert all(len(b.input_ids) == 8 for b in blocks[:-1]) and 2 <= len(blocks[-1].input_ids) <= 8
    assert all(b.target_mask == [1] * len(b.input_ids) for b in blocks)


def test_a_last_block_of_one_token_is_dropped_and_of_two_is_kept(tmp_path, tokenizer):
    path = tmp_path / "text.parquet"
    texts = ["one document", "and another one"]
    pq.write_table(pa.Table.from_pylist([{"text": t} for t in texts]), path)
    total = sum(len(tokenizer(t)["input_ids"]) + 1 for t in texts)
    blocks, _ = load_text_blocks(path, tokenizer, total - 1, strict=False)  # leaves 1 token over
    assert [len(b.input_ids) for b in blocks] == [total - 1]
    blocks, _ = load_text_blocks(path, tokenizer, total - 2, strict=False)  # leaves 2 tokens over
    assert [len(b.input_ids) for b in blocks] == [total - 2, 2]
    assert blocks[-1].input_ids[-1] == tokenizer.eos_token_id
