"""Is the LiteRT GPU check possible here, and must it be? (CI sets ZOO_REQUIRE_GPU_CHECK=1.)"""

import os


def gpu_required() -> bool:
    return os.environ.get("ZOO_REQUIRE_GPU_CHECK") == "1"


def gpu_ready() -> tuple[bool, str]:
    from zoo.targets.litert_gpu import gpu_available

    return gpu_available()
