"""Single weight files and pinned downloads (zoo/weights.py): training checkpoints load with weights_only, anything
needing more pickle is refused, truncated files and checksum mismatches are named — and RF-DETR's real-checkpoint
path (a bare .pth with the architecture from the variant) loads strictly and refuses another variant's weights."""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from zoo import weights
from zoo.errors import ZooError


class NotATensor:  # a global weights_only must refuse
    pass


def small_state() -> dict[str, torch.Tensor]:
    return {"layer.weight": torch.arange(6.0).view(2, 3), "layer.bias": torch.ones(2)}


def test_training_checkpoint_with_args_namespace_loads_weights_only(tmp_path):
    """rfdetr's .pth layout: {"model": state_dict, "args": argparse.Namespace(...)}."""
    path = tmp_path / "checkpoint_best_regular.pth"
    torch.save({"model": small_state(), "args": argparse.Namespace(lr=1e-4, encoder="dinov2"), "epoch": 3}, path)
    config, state, hashes = weights.load_weight_file(path)
    assert config == {} and torch.equal(state["layer.weight"], small_state()["layer.weight"])
    assert hashes[path.name] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_pickle_beyond_weights_only_is_refused_not_loaded_unsafely(tmp_path):
    path = tmp_path / "evil.pth"
    torch.save({"model": small_state(), "extra": NotATensor()}, path)
    with pytest.raises(ZooError, match="needs pickle beyond weights_only") as err:
        weights.load_weight_file(path)
    assert "weights_only=False" not in str(err.value) and "set to `False`" not in str(err.value)  # no unsafe advice


def test_truncated_pth_is_named_corrupt(tmp_path):
    path = tmp_path / "model.pth"
    torch.save(small_state(), path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ZooError, match="corrupt or truncated"):
        weights.load_weight_file(path)


def url_cfg(url: str, **pins):
    return OmegaConf.create({"name": "m", "variant": "v", "variants": {"v": {"url": {"url": url, **pins}}}})


def test_url_download_is_verified_against_its_pin(tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_WEIGHTS_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "remote.pth"
    torch.save({"model": small_state()}, source)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    md5 = hashlib.md5(source.read_bytes()).hexdigest()

    with pytest.raises(ZooError, match="does not match its pin"):
        weights.resolve(url_cfg(source.as_uri(), sha256="0" * 64), "url", tmp_path, None)
    assert not list((tmp_path / "cache").iterdir())              # the bad download was deleted
    with pytest.raises(ZooError, match="no sha256"):
        weights.resolve(url_cfg(source.as_uri()), "url", tmp_path, None)

    checkpoint = weights.resolve(url_cfg(source.as_uri(), sha256=digest, md5=md5), "url", tmp_path, None)
    assert checkpoint.source == "url" and checkpoint.is_real and torch.equal(checkpoint.state_dict["layer.bias"],
                                                                               torch.ones(2))
    cached = tmp_path / "cache" / "remote.pth"
    cached.write_bytes(b"tampered")                              # a corrupted cache entry is re-fetched, not used
    assert weights.resolve(url_cfg(source.as_uri(), md5=md5), "url", tmp_path, None).state_dict


# ---------------------------------------------------------------- RF-DETR: upstream .pth files


def rf_detr_cfg(variant: str):
    from zoo.registry import load_model_config

    cfg = load_model_config("rf-detr")
    cfg.variant = variant
    return cfg


def test_rf_detr_upstream_pth_loads_strictly_with_the_variant_architecture(tmp_path):
    """A bare .pth in upstream's layout (tiny weights here), architecture from model.variant, class count from
    the head; the weightless `_kp_active_mask` buffer newer rfdetr saves is accepted."""
    from models.rf_detr import SPEC

    tiny = weights.resolve(None, "tiny", SPEC.tiny_dir, SPEC.random_checkpoint)
    state = {**tiny.state_dict, "_kp_active_mask": torch.zeros(0, 0, dtype=torch.bool)}
    path = tmp_path / "rf-detr-tiny.pth"
    torch.save({"model": state, "args": argparse.Namespace(num_classes=5)}, path)
    checkpoint = weights.resolve(rf_detr_cfg("tiny"), f"local:{path}", SPEC.tiny_dir, SPEC.random_checkpoint)
    module = SPEC.components[0].build(checkpoint, rf_detr_cfg("tiny"))
    assert module.config.num_classes == 6 and module.config.resolution == 128


def test_rf_detr_weights_of_another_variant_are_refused():
    """Small-shaped weights (32×32 patches, 3 decoder layers) with variant=nano: named before anything loads."""
    from models.rf_detr import SPEC

    small_like = {"backbone.0.encoder.encoder.embeddings.position_embeddings": torch.zeros(1, 32 * 32 + 1, 4),
                  **{f"transformer.decoder.layers.{i}.norm1.weight": torch.ones(4) for i in range(3)}}
    checkpoint = weights.Checkpoint("local", {}, small_like)
    with pytest.raises(ZooError, match="patches_per_side=32 \\(expected 24\\), dec_layers=3 \\(expected 2\\)"):
        SPEC.components[0].build(checkpoint, rf_detr_cfg("nano"))


def test_derived_weights_stay_inside_the_project(monkeypatch):
    """Pinned downloads and the dequantised SmolLM2 land in the checkout's .cache/ (gitignored), never in
    ~/.cache: nothing outside the project and the HF cache is written. Negative control: the old
    default, `~/.cache/zoo/...`, resolves outside the project and is caught by the same check."""
    from zoo.registry import ROOT, load_model_config
    from zoo.weights import in_zoo_cache, weights_cache_dir

    monkeypatch.delenv("ZOO_CACHE", raising=False)
    monkeypatch.delenv("ZOO_WEIGHTS_CACHE", raising=False)

    def inside_project(path) -> bool:
        return path.resolve().is_relative_to(ROOT)

    assert inside_project(weights_cache_dir())
    assert inside_project(in_zoo_cache(load_model_config("gqa-llm").embedded_cache))
    assert not inside_project(in_zoo_cache("~/.cache/zoo/smollm2-135m-instruct"))
    monkeypatch.setenv("ZOO_CACHE", "/somewhere/else")
    assert weights_cache_dir() == Path("/somewhere/else/weights")
