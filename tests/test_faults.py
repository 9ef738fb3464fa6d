"""Faults never cost the good bundle: killed runs, two runs at once, full disks, bad output folders.

Real conversions of the tiny T5 (LiteRT fp32, the cheapest) run as subprocesses and are stopped at
exact points by the fault-injection hook (ZOO_TEST_PAUSE_AT: the run writes a marker file and waits),
so every kill lands where it is meant to, without timing luck. Each case starts from a copy of one good
bundle and checks that it is still at its path, byte-identical (or, after the swap, replaced by a
complete new one), that the next run removes or restores the leftovers and says so, and that nothing is
stranded: no .tmp-*/.old-* beside the bundle, no zoo-scratch-/zoo-gpu-/zoo-xdg- folder of the dead PID.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from zoo import bundle
from zoo.bundle import (BundleWriter, DiskFull, ensure_free_space, exchange_paths, is_disk_full,
                        remove_stale_temp_folders, safe_out_dir, sha256_file)
from zoo.errors import ZooError

ROOT = Path(__file__).resolve().parent.parent
CONVERT = ["-m", "zoo.convert", "model=t5", "target=litert", "weights=tiny", "model.gpu.check=false"]
CONVERT_COREAI = ["-m", "zoo.convert", "model=t5", "target=coreai", "weights=tiny"]
PAUSE_TIMEOUT_S = 180


# ---------------------------------------------------------------- helpers


def hashes(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_complete_bundle(folder: Path) -> None:
    """Every file the manifest lists is there with its sha256, and nothing else."""
    manifest = json.loads((folder / "manifest.json").read_text())
    on_disk = hashes(folder)
    on_disk.pop("manifest.json")
    assert on_disk == {rel: entry["sha256"] for rel, entry in manifest["files"].items()}
    assert manifest["status"] == "passed"


@dataclass
class Case:
    out: Path  # out_dir
    tmp: Path  # TMPDIR of the subprocesses
    good: dict[str, str]  # hashes of the good bundle copied in
    command: tuple[str, ...] = tuple(CONVERT)
    bundle: str = "litert-fp32"

    @property
    def live(self) -> Path:
        return self.out / "t5" / self.bundle

    def leftovers(self, pid: int | None = None) -> list[str]:
        beside = [p.name for p in self.live.parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name]
        temp = [p.name for p in self.tmp.iterdir() if p.name.startswith("zoo-")
                and (pid is None or f"-{pid}-" in p.name)]
        return beside + temp


class Run:
    """One `python -m zoo.convert` subprocess; output to a file (no pipe to fill up)."""

    def __init__(self, case: Case, *args: str, pause_at: str | None = None, name: str = "run"):
        self.log = case.out.parent / f"{name}.log"
        self.marker = case.out.parent / f"{name}.paused"
        env = {**os.environ, "TMPDIR": str(case.tmp), bundle.PAUSE_MARKER_ENV: str(self.marker)}
        env.pop(bundle.PAUSE_AT_ENV, None)
        if pause_at:
            env[bundle.PAUSE_AT_ENV] = pause_at
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([sys.executable, *case.command, f"out_dir={case.out}", *args], cwd=ROOT,
                                         env=env, stdout=log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def output(self) -> str:
        return " ".join(self.log.read_text().split())

    def wait_for_pause(self) -> str:
        return wait_until(lambda: self.marker.exists() and self.marker.read_text(), self, "the pause marker")

    def resume(self) -> None:
        self.marker.unlink()

    def finish(self, timeout: float = 300) -> int:
        return self.proc.wait(timeout)

    def kill(self, sig: int = signal.SIGKILL) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(60)


def wait_until(condition, run: Run, what: str, timeout: float = PAUSE_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if run.proc.poll() is not None:
            pytest.fail(f"the run exited ({run.proc.returncode}) before {what}:\n{run.log.read_text()[-3000:]}")
        time.sleep(0.05)
    run.kill()
    pytest.fail(f"timed out waiting for {what}")


def process_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", autouse=True)
def bundles_without_the_gpu_check():
    """These tests are about files and processes, so their bundles skip the GPU check
    (model.gpu.check=false). CI's ZOO_REQUIRE_GPU_CHECK=1 would rightly fail such bundles; it is lifted
    here only, for this module's conversions (in-process and the subprocesses they start)."""
    saved = os.environ.pop("ZOO_REQUIRE_GPU_CHECK", None)
    yield
    if saved is not None:
        os.environ["ZOO_REQUIRE_GPU_CHECK"] = saved


def convert_good_bundle(out: Path, command: list[str], name: str) -> Path:
    proc = subprocess.run([sys.executable, *command, f"out_dir={out}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={k: v for k, v in os.environ.items() if k != bundle.PAUSE_AT_ENV})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    live = out / "t5" / name
    assert_complete_bundle(live)
    return live


@pytest.fixture(scope="module")
def good_bundle(tmp_path_factory) -> Path:
    """One real conversion per module; every case starts from a copy of it."""
    return convert_good_bundle(tmp_path_factory.mktemp("good"), CONVERT, "litert-fp32")


@pytest.fixture
def case(tmp_path, good_bundle) -> Case:
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    tmp.mkdir()
    shutil.copytree(good_bundle, out / "t5" / "litert-fp32")
    return Case(out, tmp, hashes(out / "t5" / "litert-fp32"))


# ---------------------------------------------------------------- killed runs


@pytest.mark.parametrize("point", ["convert", "save", "verify", "swap"])
def test_sigkill_keeps_a_good_bundle_and_the_next_run_recovers(case, point):
    run = Run(case, pause_at=point, name="killed")
    assert run.wait_for_pause().split() == [str(run.pid), point]
    if point == "swap":
        # Exchanged: the new bundle is live and complete, the previous one (intact) waits at the staging path.
        retired = [p for p in case.live.parent.iterdir() if ".tmp-" in p.name]
        assert len(retired) == 1 and hashes(retired[0]) == case.good
    assert run.kill() == -signal.SIGKILL
    if point == "swap":
        assert_complete_bundle(case.live)
    else:
        assert hashes(case.live) == case.good  # untouched, byte for byte
    stranded = case.leftovers(run.pid)
    assert stranded, "a SIGKILL cannot clean up; the next run must find something to recover"

    after = Run(case, name="next")
    assert after.finish() == 0, after.output
    assert_complete_bundle(case.live)
    assert case.leftovers() == [], "nothing may stay stranded after the next run"
    for name in stranded:  # the next run said what it did, for each leftover
        assert f"removed {name}" in after.output or name in after.output, (name, after.output)
    recovered = json.loads((case.live / "report.json").read_text())["recovered"]
    assert recovered and all(any(name in note for note in recovered) for name in stranded)


def test_sigkill_mid_swap_of_a_coreai_bundle(tmp_path):
    """The same swap for a Core AI bundle, whose artifact is a folder (model.aimodel/)."""
    case = Case(tmp_path / "out", tmp_path / "tmp", {}, tuple(CONVERT_COREAI), "coreai-bf16")
    case.tmp.mkdir()
    case.good = hashes(convert_good_bundle(case.out, CONVERT_COREAI, "coreai-bf16"))
    run = Run(case, pause_at="swap", name="killed")
    run.wait_for_pause()
    [retired] = [p for p in case.live.parent.iterdir() if ".tmp-" in p.name]
    assert hashes(retired) == case.good and any(p.is_dir() for p in retired.iterdir())
    run.kill()
    assert_complete_bundle(case.live)
    after = Run(case, name="next")
    assert after.finish() == 0, after.output
    assert f"removed {retired.name}" in after.output
    assert_complete_bundle(case.live)
    assert case.leftovers() == []


def _writer_script(mode: str) -> list[str]:
    """A writer that commits a one-file bundle with the renameat2 exchange disabled (the fallback swap)."""
    code = (
        "import sys; from pathlib import Path; from zoo import bundle\n"
        "bundle.exchange_paths = lambda a, b: False  # as where renameat2 does not exist\n"
        "with bundle.BundleWriter(Path(sys.argv[1])) as w:\n"
        "    if sys.argv[2] == 'commit':\n"
        "        (w.staging / 'model.tflite').write_bytes(b'new'); w.commit()\n"
    )
    return [sys.executable, "-c", code, "BUNDLE", mode]


def test_sigkill_between_the_two_renames_of_the_fallback_swap_is_restored(case):
    env = {**os.environ, bundle.PAUSE_AT_ENV: "swap", bundle.PAUSE_MARKER_ENV: str(case.out.parent / "m"),
           "TMPDIR": str(case.tmp)}
    cmd = _writer_script("commit")
    cmd[cmd.index("BUNDLE")] = str(case.live)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    marker = case.out.parent / "m"
    deadline = time.monotonic() + 60
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the writer never reached the swap"
    proc.kill()
    proc.wait()
    assert not case.live.exists(), "the fallback has a gap: this is the state recovery must repair"
    retired = case.live.with_name(f".{case.live.name}.old-{proc.pid}")
    assert hashes(retired) == case.good

    cmd = _writer_script("open")
    cmd[cmd.index("BUNDLE")] = str(case.live)
    again = subprocess.run(cmd, cwd=ROOT, env={**env, bundle.PAUSE_AT_ENV: ""}, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert hashes(case.live) == case.good
    assert f"restored {case.live} from {retired.name}" in again.stderr
    assert case.leftovers() == []


def test_sigterm_cleans_up_like_an_exception(case):
    run = Run(case, pause_at="verify", name="terminated")
    run.wait_for_pause()
    assert [p for p in case.live.parent.iterdir() if ".tmp-" in p.name], "staging exists while the run works"
    assert run.kill(signal.SIGTERM) == 128 + signal.SIGTERM
    assert "interrupted: removed the unfinished bundle" in run.output and "Traceback" not in run.output
    assert hashes(case.live) == case.good
    assert case.leftovers() == [], "SIGTERM must clean up at once, not leave work for the next run"


def test_the_gpu_check_child_dies_with_its_parent(case, tmp_path):
    """SIGKILL the parent while its GPU-check child runs: the child must not outlive it (PR_SET_PDEATHSIG)."""
    marker = tmp_path / "child.paused"
    code = ("import sys; from pathlib import Path; from zoo.targets.litert_gpu import gpu_check, random_inputs\n"
            "p = Path(sys.argv[1]); gpu_check(p, random_inputs(p), env={'ZOO_FAULT_TEST': '1'})\n")
    env = {**os.environ, "TMPDIR": str(case.tmp), bundle.PAUSE_AT_ENV: "gpu_child",
           bundle.PAUSE_MARKER_ENV: str(marker)}
    parent = subprocess.Popen([sys.executable, "-c", code, str(case.live / "model.tflite")], cwd=ROOT, env=env)
    deadline = time.monotonic() + 120
    while not marker.exists() and parent.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the GPU child never started"
    child = int(marker.read_text().split()[0])
    assert child in [c.pid for c in psutil.Process(parent.pid).children()]
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while not process_gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not process_gone(child):
        os.kill(child, signal.SIGKILL)  # do not leave it behind, then fail
        pytest.fail("the GPU child outlived its SIGKILLed parent")
    stranded = case.leftovers(parent.pid)
    assert any(name.startswith(f"zoo-gpu-{parent.pid}-") for name in stranded)
    notes = remove_stale_temp_folders(case.tmp)
    assert case.leftovers() == [] and len(notes) == len(stranded)
    assert all(f"PID {parent.pid}" in note for note in notes)


# ---------------------------------------------------------------- two runs at once


def test_two_runs_of_one_bundle_take_turns_and_no_wait_fails_clearly(case):
    first = Run(case, pause_at="convert", name="first")  # holds the bundle's lock while paused
    first.wait_for_pause()

    impatient = Run(case, "no_wait=true", name="impatient")
    second = Run(case, name="second")  # started together: the box has two cores
    assert impatient.finish() == 2, impatient.output
    assert f"Another zoo run (PID {first.pid}) is writing the bundle {case.live}" in impatient.output
    assert "Fix:" in impatient.output and "Traceback" not in impatient.output

    wait_until(lambda: "waiting for another zoo run" in second.output, second, "the waiting message")
    assert f"(PID {first.pid})" in second.output
    first.resume()
    assert first.finish() == 0, first.output
    assert second.finish() == 0, second.output
    assert_complete_bundle(case.live)
    assert hashes(case.live) != case.good  # both runs committed in turn
    assert case.leftovers() == []


# ---------------------------------------------------------------- full disk


@pytest.fixture
def small_disk(tmp_path):
    """A 1.5 MiB tmpfs (root only): room for the good bundle, not for a second one."""
    mount = tmp_path / "disk"
    mount.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1536k", "tmpfs", str(mount)], check=True,
                       capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot mount a tmpfs here ({exc}); test_enospc_at_each_write simulates the full disk")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_full_output_disk_is_refused_before_save(small_disk, good_bundle, tmp_path):
    case = Case(small_disk, tmp_path / "tmp", {})
    case.tmp.mkdir()
    shutil.copytree(good_bundle, case.live)
    case.good = hashes(case.live)
    run = Run(case, name="full")
    assert run.finish() == 2, run.output
    assert f"Not enough disk space in {case.live.parent}: the bundle needs about" in run.output  # the pre-check
    assert "bytes are free" in run.output and "Fix:" in run.output and "Traceback" not in run.output
    assert hashes(case.live) == case.good
    assert case.leftovers() == []


def test_full_temp_disk_is_refused_before_the_converter_aborts(case, small_disk):
    case.tmp = small_disk  # the scratch folder lives in TMPDIR
    (small_disk / "filler").write_bytes(b"\0" * (1 << 20))
    run = Run(case, name="full-tmp")
    assert run.finish() == 2, run.output  # not LLVM's "IO failure on output stream" abort
    assert f"Not enough disk space in {small_disk}" in run.output and "TMPDIR" in run.output
    assert hashes(case.live) == case.good
    assert [p.name for p in small_disk.iterdir() if p.name.startswith("zoo-")] == []
    assert [p for p in case.live.parent.iterdir() if ".tmp-" in p.name] == []


@pytest.fixture(scope="module")
def t5_cfg():
    from zoo.config import compose_convert

    return compose_convert(["model=t5", "model.gpu.check=false"]).model


@pytest.mark.parametrize("where", ["save", "report.json", "manifest.json"])
def test_enospc_at_each_write_is_a_clear_error_with_staging_removed(case, t5_cfg, monkeypatch, where):
    from zoo.pipeline import convert_model
    from zoo.targets.litert import LiteRTTarget

    def disk_full(path):
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    if where == "save":
        def save(self, tflite_path, dest, metadata):
            (dest / "model.tflite").write_bytes(tflite_path.read_bytes()[:1000])  # a partial write
            raise disk_full(dest / "model.tflite")

        monkeypatch.setattr(LiteRTTarget, "save", save)
    else:
        real_write = bundle.atomic_write_bytes

        def write(path, data):
            if path.name == where:
                raise disk_full(path)
            real_write(path, data)

        monkeypatch.setattr(bundle, "atomic_write_bytes", write)
    with pytest.raises(ZooError) as err:
        convert_model(t5_cfg, ["litert"], out_dir=case.out)
    assert isinstance(err.value, DiskFull)
    assert f"Not enough disk space in {case.live.parent}" in err.value.problem and "bytes are free" in err.value.problem
    assert hashes(case.live) == case.good
    assert [p for p in case.live.parent.iterdir() if ".tmp-" in p.name or p.name.endswith(".failed")] == []


def test_json_writes_are_atomic(tmp_path, monkeypatch):
    path = tmp_path / "report.json"
    bundle.write_json(path, {"status": "passed"})

    def fsync(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError):
        bundle.write_json(path, {"status": "new"})
    assert json.loads(path.read_text()) == {"status": "passed"}  # never truncated, never 0 bytes
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


# ---------------------------------------------------------------- unit: free space, out_dir, swap, lock


def test_free_space_check_names_the_folder_and_the_bytes(tmp_path):
    ensure_free_space(tmp_path, 1000)  # a kilobyte fits anywhere a test runs
    with pytest.raises(DiskFull) as err:
        ensure_free_space(tmp_path, 10**18)  # an exabyte fits nowhere
    needed = int(10**18 * bundle.SPACE_MARGIN) + bundle.SPACE_SLACK_BYTES
    assert f"Not enough disk space in {tmp_path}" in err.value.problem
    assert f"({needed} bytes)" in err.value.problem and "bytes are free" in err.value.problem
    assert "out_dir=" in err.value.fix


def test_enospc_in_a_scratch_folder_names_the_temp_dir_and_tmpdir(tmp_path):
    import tempfile

    scratch_file = Path(tempfile.gettempdir()) / f"zoo-scratch-{os.getpid()}-x" / "fp32.tflite"
    err = bundle.disk_full_error(tmp_path / "out", cause=OSError(errno.ENOSPC, "No space left", str(scratch_file)))
    assert err.problem.startswith(f"Not enough disk space in {tempfile.gettempdir()}:") and "TMPDIR" in err.fix
    err = bundle.disk_full_error(tmp_path, cause=OSError(errno.ENOSPC, "No space left", str(tmp_path / "x.json")))
    assert err.problem.startswith(f"Not enough disk space in {tmp_path}:") and "out_dir=PATH" in err.fix


def test_disk_full_is_recognised_through_wrapping_exceptions():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/x/model.tflite")
        except OSError as inner:
            raise RuntimeError("export failed") from inner
    except RuntimeError as outer:
        assert is_disk_full(outer)
    assert not is_disk_full(RuntimeError("export failed")) and not is_disk_full(OSError(errno.EACCES, "denied"))


@pytest.mark.parametrize("value", ["", "  ", None])
def test_empty_out_dir_is_refused(value):
    with pytest.raises(ZooError, match="output folder is empty") as err:
        safe_out_dir(value)
    assert "out_dir=PATH" in err.value.fix


def test_out_dir_inside_a_bundle_is_refused(good_bundle, tmp_path):
    assert safe_out_dir(tmp_path / "exports") == tmp_path / "exports"
    (tmp_path / "other-tool").mkdir()
    (tmp_path / "other-tool" / "manifest.json").write_text('{"name": "not a zoo bundle"}')
    assert safe_out_dir(tmp_path / "other-tool")  # a foreign manifest.json is not a bundle
    for inside in (good_bundle, good_bundle / "exports", good_bundle / "a" / "b"):
        with pytest.raises(ZooError, match=f"existing bundle {good_bundle}") as err:
            safe_out_dir(inside)
        assert "outside any bundle" in err.value.fix
    assert not (good_bundle / "exports").exists()


def test_cli_refuses_an_empty_out_dir_before_any_work(run_cli):
    proc = run_cli("zoo.convert", "model=t5", "target=litert", "weights=tiny", "out_dir=")
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, out
    assert "The output folder is empty" in out and "Fix:" in out and "Traceback" not in out
    assert "resolve_weights" not in out  # refused before the first stage


def test_exchange_swaps_two_folders(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "f").write_text("A"), (b / "f").write_text("B")
    assert exchange_paths(a, b), "renameat2(RENAME_EXCHANGE) should work on this Linux filesystem"
    assert (a / "f").read_text() == "B" and (b / "f").read_text() == "A"


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "fallback"])
def test_commit_replaces_the_live_bundle_and_leaves_nothing_behind(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(bundle, "exchange_paths", lambda a, b: False)
    final = tmp_path / "t5" / "litert-fp32"
    for content in (b"old", b"new"):
        with BundleWriter(final) as writer:
            (writer.staging / "model.tflite").write_bytes(content)
            writer.commit()
    assert (final / "model.tflite").read_bytes() == b"new"
    assert sorted(p.name for p in final.parent.iterdir()) == [".litert-fp32.lock", "litert-fp32"]


def test_an_error_inside_the_writer_removes_staging_and_keeps_the_live_bundle(tmp_path):
    final = tmp_path / "b"
    with BundleWriter(final) as writer:
        (writer.staging / "f").write_text("good")
        writer.commit()
    with pytest.raises(RuntimeError), BundleWriter(final) as writer:
        (writer.staging / "f").write_text("half")
        raise RuntimeError("a stage failed")
    assert (final / "f").read_text() == "good"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".b.lock", "b"]


def test_second_writer_with_no_wait_fails_while_the_first_holds_the_lock(tmp_path):
    final = tmp_path / "b"
    with BundleWriter(final):
        with pytest.raises(ZooError) as err:
            BundleWriter(final, no_wait=True)
        assert f"(PID {os.getpid()}) is writing the bundle {final}" in err.value.problem
        assert "no_wait" in err.value.fix
    with BundleWriter(final, no_wait=True):  # released on exit
        pass


def test_stale_temp_folders_of_dead_runs_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    for name in (f"zoo-scratch-{dead_pid}-a", f"zoo-gpu-{dead_pid}-b", f"zoo-scratch-{os.getpid()}-c",
                 "zoo-scratch-legacy", "zoo-gpu-table-x"):
        (tmp_path / name).mkdir()
    notes = remove_stale_temp_folders(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"zoo-scratch-{os.getpid()}-c", "zoo-gpu-table-x", "zoo-scratch-legacy"])
    assert len(notes) == 2 and all(f"PID {dead_pid} (no longer running)" in n for n in notes)


def test_recovery_restores_an_orphaned_old_bundle_and_removes_the_rest(tmp_path):
    final = tmp_path / "b"
    for name in (".b.old-1", ".b.old-2", ".b.tmp-3-x"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "f").write_text(name)
    os.utime(tmp_path / ".b.old-1", (0, 0))  # older: the newest retired bundle is the one to restore
    notes = bundle.recover_leftovers(final)
    assert (final / "f").read_text() == ".b.old-2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]
    assert len(notes) == 3 and notes[0].startswith(f"restored {final} from .b.old-2")


def test_ctrl_c_ends_with_one_line_and_status_130(tmp_path):
    """SIGINT (Ctrl-C) cleans up like an exception, prints no traceback and exits 130."""
    marker = tmp_path / "paused"
    env = {**os.environ, bundle.PAUSE_AT_ENV: "verify", "ZOO_TEST_PAUSE_MARKER": str(marker)}
    # A terminal's Ctrl-C reaches a process whose SIGINT is at its default. A child inherits an *ignored* SIGINT, and
    # Python then installs no KeyboardInterrupt handler; something earlier in the full suite leaves the pytest process
    # so (measured: the run kept verifying 120 s after the signal, in the full suite only), so reset it in the child.
    proc = subprocess.Popen([sys.executable, *CONVERT, f"out_dir={tmp_path / 'out'}"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + PAUSE_TIMEOUT_S
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert marker.exists(), "the run never reached the pause"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-2000:]
    assert "Traceback" not in out and "interrupted (Ctrl-C)" in out
    bundle_dir = tmp_path / "out" / "t5"
    assert [p.name for p in bundle_dir.iterdir() if ".tmp-" in p.name] == []
