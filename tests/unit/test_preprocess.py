"""`oxrl preprocess` core: each converter on fixtures of its real source's shape, manifests, hashes, media, errors."""

import base64
import hashlib
import io
import json
import os
import random
import re
import wave

os.environ["HF_DATASETS_OFFLINE"] = "1"  # before datasets is imported: nothing here may reach the Hub

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from oxrl_core.data.preference import load_preference_examples
from oxrl_core.data.records import load_prompts, load_sft_examples
from oxrl_core.errors import OxrlError
from oxrl_core.preprocess.pipeline import parse_mapping, preprocess
from oxrl_core.rewards.math import gsm8k_reward, math_reward

STRING_MESSAGES = "list<item: struct<role: string, content: string>>"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def write_jsonl(path, lines: list):
    """One line per item: dicts as JSON, strings verbatim (malformed lines)."""
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def read_manifest(out, split="train") -> dict:
    return json.loads((out / f"{split}.manifest.json").read_text())


def output_rows(out, split="train") -> list[dict]:
    return pq.read_table(out / f"{split}.parquet").to_pylist()


# GSM8K (openai/gsm8k, subset main): question, answer = worked solution with <<calculator>> notes, then "#### N".
GSM8K = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether "
        "in April and May.\n#### 72",
    },
    {
        "question": "A farm has 1,200 hens and buys 300 more. How many hens now?",
        "answer": "1,200 + 300 = <<1200+300=1500>>1,500\n#### 1,500",
    },
    {"question": "How much is 3 minus 5?", "answer": "3 - 5 = -2\n#### -2"},
    {"question": "How many?", "answer": "It is 4."},  # no ####
    {"question": "How many?", "answer": "#### four"},
    {"question": 12, "answer": "#### 12"},
    "{not json",
    {"answer": "#### 3"},
]


def test_gsm8k_keeps_the_final_number_and_reports_every_bad_row_by_line(tmp_path, tokenizer):
    source = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    manifest = preprocess(str(source), "gsm8k", tmp_path / "out")
    assert output_rows(tmp_path / "out") == [
        {"prompt": GSM8K[0]["question"], "answer": "72"},
        {"prompt": GSM8K[1]["question"], "answer": "1500"},
        {"prompt": GSM8K[2]["question"], "answer": "-2"},
    ]
    on_disk = read_manifest(tmp_path / "out")
    assert on_disk["counts"] == {"read": 8, "written": 3, "dropped": 5} and on_disk["format"] == "gsm8k"
    assert on_disk["schema"] == {"prompt": "string", "answer": "string"}
    assert on_disk["source"] == str(source) and on_disk["output"] == str(tmp_path / "out" / "train.parquet")
    reasons = {d["row"]: d["reason"] for d in on_disk["dropped"]}
    assert list(reasons) == [4, 5, 6, 7, 8]
    assert reasons[4].startswith("no '####' in field 'answer'")
    assert reasons[5] == "the text after '####' is not a number: 'four'"
    assert reasons[6] == "field 'question' must be a string, got int"
    assert reasons[7].startswith("malformed JSON")
    assert reasons[8] == "missing field 'question'; the row's fields: answer; rename one with --map question=COLUMN"
    assert on_disk == json.loads(json.dumps(manifest.__dict__))

    # an RL prompt file for the gsm8k reward
    prompts, report = load_prompts(tmp_path / "out" / "train.parquet", tokenizer, max_prompt_len=512, strict=True)
    assert report.kept == 3 and prompts[1].record["answer"] == "1500"
    assert gsm8k_reward("So 1,500 hens.\n#### 1,500", prompts[1].record) == 1.0
    assert gsm8k_reward("#### 1400", prompts[1].record) == 0.0


def test_math_takes_the_last_boxed_answer_with_nested_braces_and_keeps_level_and_type(tmp_path):
    # MATH (Hendrycks et al.) as the Hub ships it: parquet of problem, level, type, solution.
    rows = [
        (
            "What is $\\frac12 + \\frac14$?",
            "Level 1",
            "Prealgebra",
            "We get $\\frac{2}{4}+\\frac{1}{4} = \\boxed{\\frac{3}{4}}$.",
        ),
        ("Find $\\sin 60^\\circ$.", "Level 2", "Precalculus", "It is $\\boxed{\\frac{\\sqrt{3}}{2}}$."),
        ("Solve $x^2 = 25$, $x > 0$.", None, None, "First $\\boxed{-5}$ is negative, so $x = \\boxed{5}$."),
        ("What is 7?", "Level 1", "Algebra", "The answer is 7."),
        ("Unbalanced.", "Level 3", "Algebra", "So $\\boxed{\\frac{1}{2}$."),
        ("Empty.", "Level 3", "Algebra", "So $\\boxed{}$."),
        ("No solution.", "Level 4", "Geometry", None),
    ]
    source = tmp_path / "math.parquet"
    pq.write_table(pa.Table.from_pylist([dict(zip(("problem", "level", "type", "solution"), r)) for r in rows]), source)
    manifest = preprocess(str(source), "math", tmp_path / "out", split="test")
    written = output_rows(tmp_path / "out", "test")
    assert written == [
        {"prompt": rows[0][0], "answer": "\\frac{3}{4}", "level": "Level 1", "type": "Prealgebra"},
        {"prompt": rows[1][0], "answer": "\\frac{\\sqrt{3}}{2}", "level": "Level 2", "type": "Precalculus"},
        {"prompt": rows[2][0], "answer": "5", "level": None, "type": None},
    ]
    assert manifest.counts == {"read": 7, "written": 3, "dropped": 4}
    assert manifest.schema == {"prompt": "string", "answer": "string", "level": "string", "type": "string"}
    assert manifest.dropped == [
        {"row": 4, "reason": "no complete \\boxed{...} in field 'solution' (MATH marks its final answer with \\boxed)"},
        {"row": 5, "reason": "no complete \\boxed{...} in field 'solution' (MATH marks its final answer with \\boxed)"},
        {"row": 6, "reason": "empty \\boxed{} in field 'solution'"},
        {
            "row": 7,
            "reason": "missing field 'solution'; the row's fields: problem, level, type; "
            "rename one with --map solution=COLUMN",
        },
    ]
    assert math_reward("so \\boxed{\\dfrac{\\sqrt3}{2}}", written[1]) == 1.0  # the math reward reads the answer


def openr1_row(problem, generations, math_verify, llama=None, complete=None, answer="3"):
    """A row of open-r1/OpenR1-Math-220k with every column of its dataset card."""
    n = len(generations)
    return {
        "problem": problem,
        "solution": f"... so the answer is $\\boxed{{{answer}}}$.",
        "answer": answer,
        "problem_type": "Algebra",
        "question_type": "math-word-problem",
        "source": "olympiads",
        "uuid": f"uuid-{problem[:8]}",
        "is_reasoning_complete": complete if complete is not None else [True] * n,
        "generations": generations,
        "correctness_math_verify": math_verify,
        "correctness_llama": llama,
        "finish_reasons": ["stop"] * n,
        "correctness_count": sum(math_verify),
        "messages": [
            {"role": "user", "content": problem},
            {"role": "assistant", "content": generations[0] if n else ""},
        ],
    }


def trace(text, answer="3"):
    return f"<think>\n{text}\n</think>\nSo $x = \\boxed{{{answer}}}$."


def test_openr1_writes_one_sft_record_per_verified_complete_trace(tmp_path, tokenizer):
    import datasets

    rows = [
        openr1_row("Solve 2x = 6.", [trace("Divide by 2."), trace("x is half of 6.")], [True, True]),
        openr1_row(
            "Solve x + 1 = 4.", [trace("x = 4 - 1.", "4"), trace("Subtract one.")], [False, False], llama=[False, True]
        ),
        openr1_row("Solve 3x = 9.", [trace("Hmm"), trace("Wait", "9")], [True, False], complete=[False, True]),
        openr1_row("Solve x - 2 = 1.", [trace("Add 2."), trace("x = 3.")], [True]),
        {**openr1_row("Solve x = 3.", [trace("Yes.")], [True]), "problem": None},
    ]
    folder = tmp_path / "openr1"
    datasets.DatasetDict({"default": datasets.Dataset.from_list(rows)}).save_to_disk(str(folder))
    manifest = preprocess(str(folder), "openr1", tmp_path / "out", split="default")
    assert output_rows(tmp_path / "out", "default") == [
        {"prompt": "Solve 2x = 6.", "completion": trace("Divide by 2."), "answer": "3"},
        {"prompt": "Solve 2x = 6.", "completion": trace("x is half of 6."), "answer": "3"},
        {"prompt": "Solve x + 1 = 4.", "completion": trace("Subtract one."), "answer": "3"},  # the judge's verdict
    ]
    assert manifest.counts == {"read": 5, "written": 3, "dropped": 3}
    assert manifest.schema == {"prompt": "string", "completion": "string", "answer": "string"}
    assert manifest.dropped == [
        {
            "row": 3,
            "reason": "none of the 2 generations is both verified correct (correctness_math_verify or "
            "correctness_llama) and complete (is_reasoning_complete)",
        },
        {"row": 4, "reason": "field 'correctness_math_verify' has 1 entries for 2 generations"},
        {
            "row": 5,
            "reason": "missing field 'problem'; the row's fields: "
            f"{', '.join(k for k in rows[4] if k not in ('problem', 'correctness_llama'))}; "
            "rename one with --map problem=COLUMN",
        },
    ]
    examples, report = load_sft_examples(tmp_path / "out" / "default.parquet", tokenizer, max_len=256, strict=True)
    assert report.kept == 3
    masked = tokenizer.decode([t for t, m in zip(examples[0].input_ids, examples[0].target_mask) if m])
    assert "Divide by 2." in masked and "Solve 2x" not in masked  # trained on the trace, not the problem

    with pytest.raises(OxrlError, match=r"--split 'train': .* has no such split; its splits: default"):
        preprocess(str(folder), "openr1", tmp_path / "out")


def messages(*turns):
    return [{"role": role, "content": content} for role, content in turns]


PREFERENCE = [
    {"prompt": "What is 2 + 2?", "chosen": "4", "rejected": "5"},
    # HuggingFaceH4/ultrafeedback_binarized: a prompt string beside whole conversations, plus scores
    {
        "prompt": "Name a color.",
        "prompt_id": "abc",
        "score_chosen": 8.0,
        "score_rejected": 2.0,
        "chosen": messages(("user", "Name a color."), ("assistant", "Blue.")),
        "rejected": messages(("user", "Name a color."), ("assistant", "Seven.")),
    },
    # implicit prompt: two conversations sharing their first three messages
    {
        "chosen": messages(("user", "hi"), ("assistant", "hello"), ("user", "bye"), ("assistant", "goodbye")),
        "rejected": messages(("user", "hi"), ("assistant", "hello"), ("user", "bye"), ("assistant", "whatever")),
    },
    {
        "prompt": messages(("system", "Be brief."), ("user", "Capital of France?")),
        "chosen": "Paris.",
        "rejected": "Lyon.",
        "margin": 2,
    },
    {"chosen": "a", "rejected": "b"},
    {"prompt": "x", "chosen": "y"},
    {"prompt": "x", "chosen": "y", "rejected": "z", "margin": "big"},
    {
        "chosen": messages(("user", "one"), ("assistant", "a")),
        "rejected": messages(("user", "two"), ("assistant", "b")),
    },
    {"prompt": "x", "chosen": messages(("bot", "y")), "rejected": "z"},
]


def test_preference_normalises_every_shape_to_conversations_that_preference_training_loads(tmp_path, tokenizer):
    source = write_jsonl(tmp_path / "prefs.jsonl", PREFERENCE)
    manifest = preprocess(str(source), "preference", tmp_path / "out")
    assert output_rows(tmp_path / "out") == [
        {
            "prompt": messages(("user", "What is 2 + 2?")),
            "chosen": messages(("assistant", "4")),
            "rejected": messages(("assistant", "5")),
            "margin": None,
        },
        {
            "prompt": messages(("user", "Name a color.")),
            "chosen": messages(("assistant", "Blue.")),
            "rejected": messages(("assistant", "Seven.")),
            "margin": None,
        },
        {
            "prompt": messages(("user", "hi"), ("assistant", "hello"), ("user", "bye")),
            "chosen": messages(("assistant", "goodbye")),
            "rejected": messages(("assistant", "whatever")),
            "margin": None,
        },
        {
            "prompt": messages(("system", "Be brief."), ("user", "Capital of France?")),
            "chosen": messages(("assistant", "Paris.")),
            "rejected": messages(("assistant", "Lyon.")),
            "margin": 2.0,
        },
    ]
    assert manifest.schema == {
        "prompt": STRING_MESSAGES,
        "chosen": STRING_MESSAGES,
        "rejected": STRING_MESSAGES,
        "margin": "double",
    }
    assert manifest.counts == {"read": 9, "written": 4, "dropped": 5}
    reasons = {d["row"]: d["reason"] for d in manifest.dropped}
    assert list(reasons) == [5, 6, 7, 8, 9]
    assert reasons[5].startswith("without a 'prompt' field, 'chosen' must be a whole conversation")
    assert reasons[6].startswith("missing field 'rejected' (a preference record needs 'chosen' and 'rejected')")
    assert reasons[7] == "field 'margin' must be a finite number, got 'big'"
    assert reasons[8].startswith("no shared prompt")
    assert reasons[9].startswith("message 0 must be {role: one of system, user, assistant, tool")

    pairs, report = load_preference_examples(tmp_path / "out" / "train.parquet", tokenizer, max_len=128, strict=True)
    assert report.kept == 4 and [p.margin for p in pairs] == [0.0, 0.0, 0.0, 2.0]
    chosen = pairs[2].chosen
    assert tokenizer.decode([t for t, m in zip(chosen.input_ids, chosen.target_mask) if m]).startswith("goodbye")


CSV = 'id,question,label,notes\n1,What is 1+1?,2,easy\n2,"What is 2, plus 2?",4,\n3,too,many,cells,here\n'


def test_generic_renames_mapped_columns_keeps_the_rest_and_drops_rows_with_extra_cells(tmp_path):
    source = tmp_path / "my.csv"
    source.write_text(CSV)
    manifest = preprocess(str(source), "generic", tmp_path / "out", mapping={"prompt": "question", "answer": "label"})
    assert output_rows(tmp_path / "out") == [
        {"id": "1", "notes": "easy", "prompt": "What is 1+1?", "answer": "2"},
        {"id": "2", "notes": "", "prompt": "What is 2, plus 2?", "answer": "4"},
    ]
    assert manifest.mapping == {"prompt": "question", "answer": "label"}
    assert manifest.counts == {"read": 3, "written": 2, "dropped": 1}
    assert manifest.dropped == [{"row": 4, "reason": "5 cells; the header has 4"}]


def test_a_mapping_from_a_column_the_source_lacks_names_the_columns_it_has(tmp_path):
    source = tmp_path / "my.csv"
    source.write_text(CSV)
    with pytest.raises(OxrlError) as e:
        preprocess(str(source), "generic", tmp_path / "out", mapping={"prompt": "questoin", "answer": "label"})
    assert str(e.value) == f"--map prompt=questoin: no such column in {source}; its columns: id, question, label, notes"
    assert not (tmp_path / "out").exists()


def test_the_mapping_also_feeds_the_named_formats(tmp_path):
    source = write_jsonl(tmp_path / "q.jsonl", [{"query": "How many?", "response": "Two.\n#### 2"}])
    preprocess(str(source), "gsm8k", tmp_path / "out", mapping=parse_mapping(["question=query", " answer = response"]))
    assert output_rows(tmp_path / "out") == [{"prompt": "How many?", "answer": "2"}]


@pytest.mark.parametrize(
    "items, message",
    [
        (["prompt"], "--map 'prompt': expected NEW=OLD, e.g. --map prompt=question"),
        (["=question"], "--map '=question': expected NEW=OLD"),
        (["prompt=a", "prompt=b"], "--map 'prompt=b': 'prompt' is already mapped (to 'a')"),
    ],
)
def test_malformed_mappings_are_refused(items, message):
    with pytest.raises(OxrlError, match=re.escape(message)):
        parse_mapping(items)


def test_a_json_array_file_is_read_row_by_row(tmp_path):
    source = tmp_path / "alpaca.json"
    source.write_text(
        json.dumps([{"instruction": "Say hi.", "output": "Hi."}, 5, {"instruction": "Say bye.", "output": "Bye."}])
    )
    manifest = preprocess(
        str(source), "generic", tmp_path / "out", mapping={"prompt": "instruction", "completion": "output"}
    )
    assert output_rows(tmp_path / "out") == [
        {"prompt": "Say hi.", "completion": "Hi."},
        {"prompt": "Say bye.", "completion": "Bye."},
    ]
    assert manifest.dropped == [{"row": 2, "reason": "expected a JSON object, got int"}]


def png_base64() -> str:
    """A 16x16 PNG of random pixels: they do not compress, so the file can be cut inside its pixel data."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.frombytes("RGB", (16, 16), random.Random(0).randbytes(16 * 16 * 3)).save(buffer, "PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def wav_bytes(samples=10) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as audio:
        audio.setnchannels(1)
        audio.setsampwidth(2)
        audio.setframerate(8000)
        audio.writeframes(b"\x01\x00" * samples)
    return buffer.getvalue()


def test_media_that_do_not_decode_are_dropped_and_good_ones_kept_as_base64(tmp_path):
    image, audio = png_base64(), base64.b64encode(wav_bytes()).decode()
    lines = [
        {"prompt": "Describe.", "image": image},
        {"prompt": "Compare.", "images": [image, "not base64!"]},
        {"prompt": "Describe.", "image": base64.b64encode(b"hello, not an image").decode()},
        {
            "prompt": "Describe.",
            "image": base64.b64encode(base64.b64decode(image)[:400]).decode(),
        },  # of ~800 bytes: header, half the pixels
        {"prompt": "Transcribe.", "audio": audio},
        {"prompt": "Transcribe.", "audios": [base64.b64encode(wav_bytes()[:-4]).decode()]},  # 8 of the 10 samples
        {"prompt": "Transcribe.", "audio": base64.b64encode(b"ID3 an mp3 header").decode()},
        {"prompt": "Describe.", "image": 5},
        {"prompt": "Compare.", "images": image},
        {"prompt": "Compare.", "images": [image, image]},
    ]
    manifest = preprocess(str(write_jsonl(tmp_path / "mm.jsonl", lines)), "generic", tmp_path / "out")
    assert output_rows(tmp_path / "out") == [
        {"prompt": "Describe.", "image": image, "images": None, "audio": None, "audios": None},
        {"prompt": "Transcribe.", "image": None, "images": None, "audio": audio, "audios": None},
        {
            "prompt": "Transcribe.",
            "image": None,
            "images": None,
            "audio": None,
            "audios": [base64.b64encode(wav_bytes()[:-4]).decode()],
        },
        {"prompt": "Compare.", "image": None, "images": [image, image], "audio": None, "audios": None},
    ]
    reasons = {d["row"]: d["reason"] for d in manifest.dropped}
    assert list(reasons) == [2, 3, 4, 7, 8, 9]
    assert reasons[2].startswith("field 'images[1]' is not valid base64")
    assert reasons[3].startswith("field 'image' does not decode as an image (cannot identify image file")
    assert reasons[4].startswith("field 'image' does not decode as an image (image file is truncated")
    assert reasons[7].startswith("field 'audio': not decodable audio")
    assert reasons[8] == "field 'image' must be a base64 string, got int"
    assert reasons[9] == "field 'images' must be a list of base64 strings, got str"

    # media ride along with a converted record of any format
    preprocess(
        str(write_jsonl(tmp_path / "g.jsonl", [{"question": "Count the dots.", "answer": "#### 3", "image": image}])),
        "gsm8k",
        tmp_path / "g",
    )
    assert output_rows(tmp_path / "g") == [{"prompt": "Count the dots.", "answer": "3", "image": image}]


def canonical_sha256(rows: list[dict]) -> str:
    """The documented content hash, written out here: sorted keys, no spaces, UTF-8, one row per line."""
    text = "".join(json.dumps(row, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n" for row in rows)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_content_hash_is_the_canonical_json_hash_and_depends_only_on_the_content(tmp_path):
    rows = [{"prompt": "Ünïcode?", "answer": "1"}, {"prompt": "Two?", "answer": "2"}]
    jsonl = write_jsonl(tmp_path / "a.jsonl", rows)
    first = preprocess(str(jsonl), "generic", tmp_path / "a")
    assert first.sha256 == canonical_sha256(rows)
    assert preprocess(str(jsonl), "generic", tmp_path / "again").sha256 == first.sha256
    reordered = write_jsonl(tmp_path / "b.jsonl", [{"answer": r["answer"], "prompt": r["prompt"]} for r in rows])
    assert preprocess(str(reordered), "generic", tmp_path / "b").sha256 == first.sha256
    as_parquet = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist(rows), as_parquet)
    assert preprocess(str(as_parquet), "generic", tmp_path / "c").sha256 == first.sha256
    changed = write_jsonl(tmp_path / "d.jsonl", [rows[0], {"prompt": "Two?", "answer": "3"}])
    assert preprocess(str(changed), "generic", tmp_path / "d").sha256 != first.sha256


def test_arithmetic_is_deterministic_for_a_seed_and_its_answers_are_right(tmp_path):
    first = preprocess(None, "arithmetic", tmp_path / "a", n=40, seed=3, kind="rl")
    again = preprocess(None, "arithmetic", tmp_path / "b", n=40, seed=3, kind="rl")
    other = preprocess(None, "arithmetic", tmp_path / "c", n=40, seed=4, kind="rl")
    assert output_rows(tmp_path / "a") == output_rows(tmp_path / "b") != output_rows(tmp_path / "c")
    assert first.sha256 == again.sha256 != other.sha256
    assert first.source == "arithmetic(n=40, seed=3, kind=rl)" and first.counts == {
        "read": 40,
        "written": 40,
        "dropped": 0,
    }
    for row in output_rows(tmp_path / "a"):
        a, op, b = re.fullmatch(r"What is (\d+) ([+-]) (\d+)\?", row["prompt"]).groups()
        assert int(row["answer"]) == (int(a) + int(b) if op == "+" else int(a) - int(b))


@pytest.mark.parametrize(
    "kind, schema",
    [
        ("sft", {"prompt": "string", "completion": "string"}),
        ("preference", {"prompt": "string", "chosen": "string", "rejected": "string"}),
        ("kto", {"prompt": "string", "completion": "string", "label": "bool"}),
        ("text", {"text": "string"}),
    ],
)
def test_arithmetic_writes_each_kind_of_record(tmp_path, kind, schema):
    manifest = preprocess(None, "arithmetic", tmp_path, n=6, seed=0, kind=kind)
    assert manifest.schema == schema and manifest.counts["written"] == 6


def test_strict_makes_the_first_bad_row_fatal_and_writes_nothing(tmp_path):
    source = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    with pytest.raises(OxrlError) as e:
        preprocess(str(source), "gsm8k", tmp_path / "out", strict=True)
    assert str(e.value).startswith(f"{source}:4: no '####' in field 'answer'")
    assert str(e.value).endswith("(--strict makes bad records fatal; 5 bad in all)")
    assert not (tmp_path / "out").exists()


def test_a_source_without_usable_rows_is_an_error(tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"question": "a", "answer": "b"}, {"question": "c"}])
    with pytest.raises(OxrlError, match=r"no usable gsm8k record; all 2 are bad, the first: .*bad.jsonl:1: no '####'"):
        preprocess(str(bad), "gsm8k", tmp_path / "out")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(OxrlError, match="empty.jsonl: no records; it is empty"):
        preprocess(str(empty), "gsm8k", tmp_path / "out")


def test_a_column_of_mixed_types_is_an_error_naming_it(tmp_path):
    source = write_jsonl(tmp_path / "mixed.jsonl", [{"prompt": "a", "answer": 1}, {"prompt": "b", "answer": "two"}])
    with pytest.raises(OxrlError, match=r"column 'answer': its values \(int, str\) do not make one parquet column"):
        preprocess(str(source), "generic", tmp_path / "out")


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        (
            ("x.jsonl", "alpaca"),
            {},
            "--format 'alpaca': unknown; allowed: gsm8k, math, openr1, preference, generic, arithmetic",
        ),
        (("x.jsonl", "gsm8k"), {"n": 5}, "--n: only for --format arithmetic, not --format gsm8k"),
        ((None, "gsm8k"), {}, "--format gsm8k: give a SOURCE"),
        (("x.jsonl", "arithmetic"), {}, "--format arithmetic generates its rows: give no SOURCE, --map or --subset"),
        ((None, "arithmetic"), {"kind": "dpo"}, "--kind 'dpo': unknown; allowed: rl, sft, preference, kto, text"),
        ((None, "arithmetic"), {"n": 0}, "--n 0: the number of problems must be at least 1"),
        ((None, "arithmetic"), {"split": "../up"}, "--split '../up': it names the output file"),
        (("missing.jsonl", "gsm8k"), {}, "missing.jsonl: no such file"),
    ],
)
def test_bad_options_are_one_clear_error(tmp_path, args, kwargs, message):
    with pytest.raises(OxrlError) as e:
        preprocess(*args, tmp_path / "out", **kwargs)
    assert str(e.value).startswith(message)


def test_a_subset_is_refused_for_a_file(tmp_path):
    source = write_jsonl(tmp_path / "g.jsonl", GSM8K[:1])
    with pytest.raises(OxrlError, match="--subset 'main': a file has no subsets"):
        preprocess(str(source), "gsm8k", tmp_path / "out", subset="main")
