"""SFT data: record shapes, the assistant-only loss mask, prediction alignment, bad records."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from oxrl_core.data.records import load_sft_examples, read_records, sft_messages
from oxrl_core.data.sft import collate_sft, tokenize_sft
from oxrl_core.errors import OxrlError


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def masked_text(tokenizer, example) -> str:
    return tokenizer.decode([t for t, m in zip(example.input_ids, example.target_mask) if m])


def test_mask_covers_exactly_the_assistant_reply_and_its_end_token(tokenizer):
    example = tokenize_sft(
        sft_messages({"prompt": "What is 2 + 3?", "completion": "<answer>5</answer>"}), tokenizer, 128
    )
    assert masked_text(tokenizer, example) == "<answer>5</answer><|im_end|>\n"
    assert tokenizer.decode(example.input_ids).startswith("<|im_start|>user\nWhat is 2 + 3?<|im_end|>")


def test_multi_turn_masks_every_assistant_turn_and_no_user_turn(tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 1 + 1?"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "And 2 + 2?"},
        {"role": "assistant", "content": "four"},
    ]
    example = tokenize_sft(sft_messages({"messages": messages}), tokenizer, 256)
    assert masked_text(tokenizer, example) == "two<|im_end|>\nfour<|im_end|>\n"


def test_prompt_completion_equals_the_same_conversation(tokenizer):
    a = tokenize_sft(sft_messages({"prompt": "hi", "completion": "hello"}), tokenizer, 64)
    b = tokenize_sft(
        sft_messages({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}),
        tokenizer,
        64,
    )
    conversational = tokenize_sft(
        sft_messages(
            {"prompt": [{"role": "user", "content": "hi"}], "completion": [{"role": "assistant", "content": "hello"}]}
        ),
        tokenizer,
        64,
    )
    assert a == b == conversational


def test_collated_mask_is_prediction_aligned_and_zero_on_padding(tokenizer):
    short = tokenize_sft(sft_messages({"prompt": "hi", "completion": "yes"}), tokenizer, 64)
    long = tokenize_sft(sft_messages({"prompt": "What is 40 + 2?", "completion": "<answer>42</answer>"}), tokenizer, 64)
    batch = collate_sft([short, long], pad_id=tokenizer.pad_token_id)
    ids, mask = batch["input_ids"], batch["response_mask"]
    assert mask.shape == (2, ids.shape[1] - 1)
    for b, example in enumerate([short, long]):
        # response_mask[b, t] == 1 exactly when the token x[b, t+1] it predicts is a response token
        predicted = [ids[b, t + 1].item() for t in range(mask.shape[1]) if mask[b, t]]
        assert predicted == [tok for tok, m in zip(example.input_ids, example.target_mask) if m]
    n = len(short.input_ids)
    assert batch["attention_mask"][0, n:].sum() == 0 and mask[0, n - 1 :].sum() == 0


def test_prompt_longer_than_max_len_is_an_error_not_an_empty_example(tokenizer):
    with pytest.raises(ValueError, match="no response token is left"):
        tokenize_sft(sft_messages({"prompt": "word " * 50, "completion": "ok"}), tokenizer, 16)


@pytest.mark.parametrize(
    "record, reason",
    [
        ({"prompt": "hi"}, "missing field 'completion'"),
        ({"prompt": "hi", "completion": "  "}, "empty completion"),
        ({"text": "hi"}, "no 'messages' or 'prompt'/'completion'"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant message"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "role: one of"),
        ({"prompt": 3, "completion": "x"}, "must be a string or a list"),
    ],
)
def test_bad_records_say_why(record, reason):
    with pytest.raises(ValueError, match=reason):
        sft_messages(record)


def test_bad_lines_are_skipped_and_reported_with_file_and_line(tmp_path, tokenizer):
    path = tmp_path / "d.jsonl"
    good = json.dumps({"prompt": "a", "completion": "b"}).encode()
    lines = [
        good,
        b"{broken",
        b"",
        good,
        b'{"prompt": "x"}',
        b"[1, 2]",
        good,
        json.dumps({"prompt": "a", "completion": ""}).encode(),
        b'{"prompt": "caf\xe9"}',
        good,
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    examples, report = load_sft_examples(path, tokenizer, 64, strict=False)
    assert len(examples) == 4 and report.kept == 4 and report.total == 9  # the blank line is no record
    assert [(p.line, p.reason.split(" (")[0]) for p in report.problems] == [
        (2, "malformed JSON"),
        (5, "missing field 'completion'"),
        (6, "expected a JSON object, got list"),
        (8, "empty completion"),
        (9, "not UTF-8 text"),
    ]
    assert str(report.problems[0]).startswith(f"{path}:2: malformed JSON (Expecting property name")


def test_strict_makes_the_first_bad_line_fatal(tmp_path, tokenizer):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n{broken\n")
    with pytest.raises(OxrlError, match=rf"{path}:2: malformed JSON.*--strict"):
        load_sft_examples(path, tokenizer, 64, strict=True)


def test_parquet_rows_are_read_and_reported_by_row(tmp_path, tokenizer):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "a", "completion": "b"}, {"prompt": "c", "completion": ""}]), path)
    examples, report = load_sft_examples(path, tokenizer, 64, strict=False)
    assert len(examples) == 1 and [(p.line, p.reason) for p in report.problems] == [(2, "empty completion")]


def test_a_file_without_usable_records_is_an_error(tmp_path, tokenizer):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "x"}\n')
    with pytest.raises(OxrlError, match="no usable SFT record"):
        load_sft_examples(path, tokenizer, 64, strict=False)


def test_unknown_extension_and_missing_file_are_errors(tmp_path):
    with pytest.raises(OxrlError, match=r"unsupported data file type '\.csv'; allowed: \.jsonl, \.json, \.parquet"):
        read_records(tmp_path / "d.csv")
    with pytest.raises(OxrlError, match="no such data file"):
        read_records(tmp_path / "missing.jsonl")


def test_an_empty_file_is_an_error(tmp_path, tokenizer):
    path = tmp_path / "d.jsonl"
    path.write_text("\n")
    with pytest.raises(OxrlError, match="no records; it is empty"):
        load_sft_examples(path, tokenizer, 64, strict=False)


def test_a_template_that_rejects_or_rewrites_turns_is_a_reason_not_a_crash(tiny_model_dir):
    messages = sft_messages(
        {
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"},
                {"role": "assistant", "content": "d"},
            ]
        }
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(ValueError, match="the chat template rejects this conversation: roles must alternate"):
        tokenize_sft(messages, tokenizer, 64)
    # like templates that drop earlier turns' reasoning: only the last assistant turn keeps its content
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] if loop.last or m['role'] != 'assistant' else '' }}\n"
        "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
    )
    with pytest.raises(ValueError, match="not prefix-consistent"):
        tokenize_sft(messages, tokenizer, 64)
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        tokenize_sft(messages, tokenizer, 64)


def test_a_record_with_tools_offers_them_as_an_environment_does_and_trains_the_tool_calls_and_the_answer(
    tmp_path, tokenizer
):
    from oxrl_core.envs.calculator import Calculator

    call = '<tool_call>{"name": "mul", "arguments": {"a": 12, "b": 3}}</tool_call>'
    record = {
        "messages": [
            {"role": "user", "content": "What is 12 * 3?"},
            {"role": "assistant", "content": call},
            {"role": "tool", "content": "36"},
            {"role": "assistant", "content": "<answer>36</answer>"},
        ],
        "tools": Calculator.tools,
    }
    path = tmp_path / "tools.jsonl"
    path.write_text(json.dumps(record) + "\n" + json.dumps({**record, "tools": "add, mul"}) + "\n")
    [example], report = load_sft_examples(path, tokenizer, 256, strict=False)
    text = tokenizer.decode(example.input_ids)
    # the system message that lists the tools, as an episode's prompt has it, is context
    assert text.startswith("<|im_start|>system\nTools") and "mul(a, b): a * b" in text
    assert masked_text(tokenizer, example) == f"{call}<|im_end|>\n<answer>36</answer><|im_end|>\n"
    assert [p.line for p in report.problems] == [
        2
    ] and "field 'tools' must be a list of function specs" in report.problems[0].reason
