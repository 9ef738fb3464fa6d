"""The Core AI runtime's own profiler (`coreai.runtime.Profiler`) through zoo.targets.coreai.RuntimeOpProfile:
per-op time of a saved bundle, what `zoo bench` reports per Core AI row."""

import tempfile
from pathlib import Path

import torch
from torch import nn

from zoo.targets import Entry
from zoo.targets.coreai import CoreAITarget
from zoo.targets.coreai_form import pretranspose_linears


def _profile(pretransposed: bool) -> dict:
    torch.manual_seed(0)
    module = nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)]).eval()
    if pretransposed:
        module, _ = pretranspose_linears(module)
    x = torch.randn(1, 64, 256)
    target = CoreAITarget()
    entries = [Entry("main", module, {"x": x}, ["y"])]
    program = target.convert(entries, target.export(entries), None)
    with tempfile.TemporaryDirectory() as folder:
        path = target.save(program, Path(folder), {})
        with target.open(path, profile=True) as runner:
            runner.run("main", {"x": x.numpy()})
            runner.reset_profile()  # the warm-up call is not counted
            runner.run("main", {"x": x.numpy()})
            runner.run("main", {"x": x.numpy()})
            return runner.op_profile()["main"]


def test_profile_counts_each_op_per_call_and_accounts_for_the_execute_time():
    profile = _profile(pretransposed=False)
    assert profile["executions"] == 2
    ops = {row["op"]: row for row in profile["ops"]}
    assert ops["broadcasting_batch_matmul"]["calls"] == 8  # 4 Linears x 2 calls
    assert abs(sum(row["share"] for row in profile["ops"]) - 1) < 1e-3
    op_ms = sum(row["ms"] for row in profile["ops"])
    assert 0.5 * profile["execute_ms"] < op_ms <= profile["execute_ms"]


def test_negative_control_the_graph_form_pass_removes_the_transpose_time_the_profile_shows():
    """Untransposed Linear weights are transposed on every call: the profile must show it, and must not
    once the weights are stored pre-transposed."""
    before = {row["op"]: row for row in _profile(pretransposed=False)["ops"]}
    after = {row["op"]: row for row in _profile(pretransposed=True)["ops"]}
    assert before["transpose"]["calls"] == 8 and before["transpose"]["share"] > 0.01
    assert "transpose" not in after
