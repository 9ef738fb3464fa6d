"""Is the LiteRT GPU check possible here, and must it be? (CI sets ZOO_REQUIRE_GPU_CHECK=1.)"""

import os


def gpu_required() -> bool:
    return os.environ.get("ZOO_REQUIRE_GPU_CHECK") == "1"


def gpu_ready() -> tuple[bool, str]:
    from zoo.targets.litert_gpu import gpu_available

    return gpu_available()


def require_gpu() -> None:
    """Inside a test: fail under ZOO_REQUIRE_GPU_CHECK=1 (CI) or skip elsewhere when no WebGPU adapter
    can be made — a CI run that silently skipped the GPU check would look like a pass."""
    import pytest

    ok, why = gpu_ready()
    if ok:
        return
    if gpu_required():
        pytest.fail(f"ZOO_REQUIRE_GPU_CHECK=1 but the LiteRT GPU check cannot run: {why}. "
                    "Run scripts/setup_vulkan.sh.", pytrace=False)
    pytest.skip(f"LiteRT GPU check unavailable ({why}); run scripts/setup_vulkan.sh")
