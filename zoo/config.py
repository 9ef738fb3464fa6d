"""Compose the Hydra config in code (for the demo, bench and tests), the same tree the CLI uses.

The shared groups (target, precision, launcher) are files under configs/; the `model` group comes from
each model's own folder (models/<name>/config.yaml), validated and registered in Hydra's ConfigStore.
"""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from zoo.registry import CONFIG_DIR, register_model_configs


def compose_convert(overrides: list[str]):
    register_model_configs()
    if GlobalHydra.instance().is_initialized():
        # Inside a running Hydra app (a convert-all job): Hydra allows one initialization per process,
        # and that app's search path is this same config tree.
        return compose(config_name="convert", overrides=list(overrides))
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="convert", overrides=list(overrides))
