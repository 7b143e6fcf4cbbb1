"""How many sequences a vLLM engine runs at once, and what it is given for them (`capacity_settings`)."""

import json

from oxrl_core.rollout.engine import CPU_BLOCK_TOKENS, CPU_MAX_NUM_SEQS, GPU_MAX_NUM_SEQS, capacity_settings


def test_a_gpu_engine_captures_cuda_graphs_up_to_every_sequence_it_runs_at_once(tiny_model_dir):
    for asked, runs in ((48, 48), (1024, 1024), (8192, GPU_MAX_NUM_SEQS)):
        settings = capacity_settings(str(tiny_model_dir), "bfloat16", 640, 0.4, asked, on_cpu=False)
        assert settings == {
            "gpu_memory_utilization": 0.4,
            "max_num_seqs": runs,
            "compilation_config": {"max_cudagraph_capture_size": runs},
        }


def test_a_cpu_engine_sizes_its_kv_cache_from_the_model_for_the_sequences_it_runs(tiny_model_dir):
    text = json.loads((tiny_model_dir / "config.json").read_text())
    max_model_len = 4 * CPU_BLOCK_TOKENS + 1  # five blocks
    settings = capacity_settings(str(tiny_model_dir), "float32", max_model_len, 0.4, 10_000, on_cpu=True)
    per_token = (
        2
        * text["num_hidden_layers"]
        * text["num_key_value_heads"]
        * (text["hidden_size"] // text["num_attention_heads"])
        * 4
    )
    assert settings["max_num_seqs"] == CPU_MAX_NUM_SEQS
    assert settings["max_num_batched_tokens"] == CPU_MAX_NUM_SEQS * max_model_len  # every prefill in one step
    assert settings["kv_cache_memory_bytes"] == max(64 * 2**20, CPU_MAX_NUM_SEQS * 5 * CPU_BLOCK_TOKENS * per_token)
    assert "gpu_memory_utilization" not in settings  # never sized from what the machine reports
