"""A vision tower's attention through oxrl's variable-length implementation (training/attention.py:VISION_ATTENTION):
one call per block over all images' (or windows') patches, with the values of transformers' SDPA path, which calls
SDPA once per window."""

import pytest
import torch
from transformers import AutoModelForImageTextToText, Qwen2_5_VLConfig
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

from oxrl_core.models.hub import media_encoder
from oxrl_core.training.attention import VISION_ATTENTION


def qwen25_windowed_tower() -> torch.nn.Module:
    """Qwen2.5-VL's tower in small widths: windows of 4 x 4 merged patches, full attention in blocks 1 and 3."""
    config = Qwen2_5_VLConfig(
        vision_config=dict(
            depth=4,
            hidden_size=32,
            intermediate_size=32,
            num_heads=4,
            out_hidden_size=16,
            hidden_act="silu",
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=112,
            fullatt_block_indexes=[1, 3],
        )
    )
    config.vision_config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen2_5_VisionTransformerPretrainedModel._from_config(config.vision_config).eval()


@pytest.mark.parametrize("tower", ["oxrl-tiny-vl (Qwen2-VL)", "Qwen2.5-VL, windowed"])
def test_one_call_per_block_gives_the_per_window_sdpa_values(tower, tiny_vl_model_dir, monkeypatch):
    if tower.startswith("oxrl-tiny-vl"):
        model = media_encoder(
            AutoModelForImageTextToText.from_pretrained(
                tiny_vl_model_dir, attn_implementation="sdpa", dtype=torch.float32
            )
        ).eval()
    else:
        model = qwen25_windowed_tower()
    grid = torch.tensor([[1, 8, 8], [1, 16, 12], [1, 4, 4]])  # three images of 64, 192 and 16 patches
    c = model.config
    pixels = torch.randn(
        int(grid.prod(-1).sum()),
        c.in_channels * c.temporal_patch_size * c.patch_size**2,
        generator=torch.Generator().manual_seed(0),
    )
    calls = []

    def counted(module, query, *args, cu_seq_lens_q=None, **kwargs):
        calls.append((query.shape[2], len(cu_seq_lens_q) - 1))
        return varlen(module, query, *args, cu_seq_lens_q=cu_seq_lens_q, **kwargs)

    varlen = ALL_ATTENTION_FUNCTIONS[VISION_ATTENTION]
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, VISION_ATTENTION, counted)
    with torch.no_grad():
        per_window = model(pixels, grid_thw=grid).pooler_output
        model.config._attn_implementation = VISION_ATTENTION
        joined = model(pixels, grid_thw=grid).pooler_output
    assert len(calls) == len(model.blocks) and {patches for patches, _ in calls} == {272}  # every patch, every block
    if tower.startswith("Qwen2.5"):  # windowed blocks see more boundaries than the two full-attention blocks (3 images)
        assert [n for _, n in calls][1::2] == [3, 3] and min(n for _, n in calls[0::2]) > 3
    torch.testing.assert_close(joined, per_window, rtol=0, atol=1e-5)
