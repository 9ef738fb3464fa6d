"""The re-authored T5 encoder against transformers' T5EncoderModel, on the same weights."""

import pytest
import torch
from omegaconf import OmegaConf

from models import t5
from models.t5.model import T5Encoder, T5EncoderConfig
from zoo import gates
from zoo.errors import ZooError
from zoo.registry import load_model_config
from zoo.weights import resolve


@pytest.fixture(scope="module")
def cfg():
    return load_model_config("t5")


@pytest.fixture(scope="module")
def tiny(cfg):
    return resolve(cfg, "tiny", t5.TINY_DIR, t5.random_checkpoint)


def _parity(checkpoint, cfg):
    module, reference = t5.build(checkpoint, cfg), t5.reference(checkpoint, cfg)
    inputs = t5.example_inputs(checkpoint, cfg)
    with torch.no_grad():
        return gates.cosine(module(*inputs.values()).numpy(), reference(*inputs.values())[0].numpy())


def test_tiny_checkpoint_loads_strictly_and_matches_transformers(tiny, cfg):
    assert _parity(tiny, cfg) >= 0.999999


def test_state_dict_keys_are_upstream_keys(tiny, cfg):
    from transformers import T5Config, T5EncoderModel

    ours = set(t5.build(tiny, cfg).state_dict())
    upstream = set(T5EncoderModel(T5Config(**tiny.config)).state_dict())
    assert ours == upstream


def test_parity_at_a_length_that_uses_the_log_buckets(cfg):
    """L=200 > max_distance 128 reaches the clamped log-spaced buckets; base-like head count."""
    small = OmegaConf.merge(cfg, {"seq_len": 200, "variants": {"base": {"architecture": {
        "vocab_size": 300, "d_model": 48, "d_kv": 8, "d_ff": 96, "num_layers": 2, "num_heads": 6}}}})
    checkpoint = resolve(small, "random", t5.TINY_DIR, t5.random_checkpoint)
    assert _parity(checkpoint, small) >= 0.999999


def test_negative_control_stale_position_bias_breaks_parity(tiny, cfg):
    """Without the post-load refresh, the baked bias belongs to the init weights: parity must drop."""
    module = T5Encoder(T5EncoderConfig.from_hf(tiny.config), seq_len=int(cfg.seq_len))
    module.load_state_dict({**tiny.state_dict, "encoder.embed_tokens.weight": tiny.state_dict["shared.weight"]})
    stale = module.position_bias.clone()
    assert not torch.equal(stale, torch.zeros_like(stale))
    module.position_bias.zero_()  # what a forgotten refresh would leave
    reference = t5.reference(tiny, cfg)
    inputs = t5.example_inputs(tiny, cfg)
    with torch.no_grad():
        cos = gates.cosine(module(*inputs.values()).numpy(), reference(*inputs.values())[0].numpy())
    assert cos < 0.999999


def test_mismatched_keys_are_a_clear_error(tiny, cfg):
    broken = dict(tiny.state_dict)
    broken["encoder.block.0.layer.0.SelfAttention.qq.weight"] = broken.pop("encoder.block.0.layer.0.SelfAttention.q.weight")
    tiny_broken = type(tiny)(tiny.source, tiny.config, broken)
    with pytest.raises(ZooError, match="keys do not match.*1 missing.*1 unexpected"):
        t5.build(tiny_broken, cfg)
