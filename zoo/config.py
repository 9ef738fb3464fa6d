"""Compose the Hydra config in code (for the demo, bench and tests), the same tree the CLI uses."""

from __future__ import annotations

from hydra import compose, initialize_config_dir

from zoo.registry import CONFIG_DIR


def compose_convert(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="convert", overrides=list(overrides))
