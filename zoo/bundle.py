"""Bundle folders: built in a temporary sibling, then swapped into place with no moment without a bundle.

A run that fails or is interrupted at any stage leaves the previous good bundle byte-identical:
nothing ever writes into the live folder. A bundle whose gates fail is moved to `<name>.failed/`
(replacing an older failed one), never over the good one.

The swap. With a live bundle in place, the staged folder and the live one are exchanged in one
`renameat2(RENAME_EXCHANGE)` system call: at every instant the live path holds either the old or the
new complete bundle, and the retired one lands at the staging path, which is removed afterwards (a
run killed before that removal leaves only a `.<name>.tmp-*` folder, which the next run deletes). We
chose the exchange over versioned folders behind an atomically replaced symlink because the bundle
stays a plain folder: `exports/t5/litert-fp32/` is what users copy, upload and point other tools at,
and a symlink would break `cp -r`, `rsync` without `-L`, zip files and the Hub uploader. Where the
exchange is unavailable (not Linux, glibc < 2.28, kernel < 3.15, or a filesystem without
RENAME_EXCHANGE) the swap falls back to two renames — live → `.<name>.old-<pid>`, staged → live — and
recovery covers the gap: a run that finds an `.old-*` folder but no live bundle moves it back.

Around the swap:
- an exclusive lock per bundle path (`flock` on the sibling `.<name>.lock`, which stays around
  harmlessly): a second run of the same bundle waits, saying for whom, or fails at once with
  `no_wait`;
- recovery at start, under the lock: staging folders of killed runs are removed, an orphaned `.old-*`
  goes back into place, and `zoo-scratch-<pid>-*` / `zoo-gpu-<pid>-*` folders in the system temp dir
  whose process is gone are removed — each said out loud (`BundleWriter.recovered`);
- SIGTERM raises in the main thread while a writer is open, so it cleans up like Ctrl-C;
- a full disk becomes a ZooError naming the folder and the bytes, with the staging folder removed.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import glob
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from zoo.errors import ZooError

REPORT = "report.json"
MANIFEST = "manifest.json"

# Free space wanted before save: the expected bundle size × margin, plus room for report.json,
# manifest.json and filesystem overhead.
SPACE_MARGIN = 1.1
SPACE_SLACK_BYTES = 1 << 20

# Temporary folders in the system temp dir carry the owning PID, so a later run can tell a dead
# run's leftovers from a live run's working folder. zoo/targets/litert_gpu.py spells the same
# prefixes itself (its GPU child runs without the zoo package on the path).
TEMP_FOLDER = re.compile(r"^zoo-(scratch|gpu|gpu-probe|xdg|multirun)-(\d+)-")

# Test hook (tests/test_faults.py): stop at a named point so a test can kill the run exactly there.
PAUSE_AT_ENV = "ZOO_TEST_PAUSE_AT"  # comma-separated pause points: stage names, or "swap"
PAUSE_MARKER_ENV = "ZOO_TEST_PAUSE_MARKER"  # file written when paused; the run resumes once it is deleted


# ---------------------------------------------------------------- files


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_hashes(folder: Path) -> dict[str, dict]:
    """sha256 and size of every file under `folder` (except the manifest itself), by relative path."""
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel == MANIFEST:
            continue
        out[rel] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    return out


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def write_json(path: Path, data: dict) -> None:
    """Atomic: a crash or a full disk leaves the old file or none, never a truncated or 0-byte one."""
    atomic_write_bytes(Path(path), (json.dumps(data, indent=2, sort_keys=False, default=str) + "\n").encode())


def atomic_write_bytes(path: Path, data: bytes) -> None:
    # os.open rather than mkstemp: the file gets the usual permissions (0666 less the umask), not 0600.
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{os.urandom(4).hex()}.part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def sync_tree(folder: Path) -> None:
    """fsync every file and folder, so that after the swap a power cut cannot leave a live bundle of
    empty files (the rename may reach the disk before the data)."""
    for root, _dirs, files in os.walk(folder):
        for name in files:
            _fsync_path(Path(root) / name, os.O_RDONLY)
        _fsync_path(Path(root), os.O_RDONLY | os.O_DIRECTORY)


def _fsync_path(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    """The process umask, read without changing it (os.umask can only set it, racing other threads)."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status") as f:
            return int(next(line for line in f if line.startswith("Umask:")).split()[1], 8)
    return 0o022


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


# ---------------------------------------------------------------- output folder


def ensure_writable(out_dir: Path) -> None:
    """Fail before any work if the output folder cannot be created or written."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".write-test-"):
            pass
    except OSError as exc:
        if is_disk_full(exc):
            raise disk_full_error(out_dir, cause=exc) from exc
        raise ZooError(
            f"Output folder {out_dir} is not writable ({exc.strerror or exc}).",
            "pass a writable folder with out_dir=PATH (make convert OUT=PATH), or fix its permissions.",
        ) from exc


def safe_out_dir(out_dir) -> Path:
    """The output folder as a Path, refusing an empty one (it would mean the current directory) and
    one inside an existing bundle (the new bundle would be written into the live one and break its
    manifest). Checked before any work."""
    if out_dir is None or not str(out_dir).strip():
        raise ZooError(
            "The output folder is empty (out_dir= was given without a value).",
            "pass a folder with out_dir=PATH (make convert OUT=PATH), or leave it out for the default 'exports'.",
        )
    path = Path(out_dir)
    bundle = enclosing_bundle(path)
    if bundle is not None:
        where = "is the existing bundle" if bundle == path.resolve() else "is inside the existing bundle"
        raise ZooError(
            f"Output folder {path} {where} {bundle}; writing there would change that bundle and break its manifest.",
            f"choose a folder outside any bundle, e.g. out_dir={_outside_hint(bundle)} "
            "(bundles land in <out_dir>/<model>/<target>-<precision>/).",
        )
    return path


def enclosing_bundle(path: Path) -> Path | None:
    """The nearest folder at or above `path` that is a zoo bundle, if any."""
    resolved = Path(path).resolve()
    for folder in (resolved, *resolved.parents):
        if is_bundle(folder):
            return folder
    return None


def is_bundle(folder: Path) -> bool:
    """A zoo bundle has a manifest.json listing its files (or, if that is unreadable, a report.json beside it)."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return False
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return (folder / REPORT).is_file()
    return isinstance(data, dict) and "files" in data


def _outside_hint(bundle: Path) -> str:
    # <out_dir>/<model>/<target>-<precision>: the folder two levels above a bundle is an out_dir.
    return str(bundle.parent.parent) if len(bundle.parents) >= 2 else "exports"


# ---------------------------------------------------------------- disk space


def free_bytes(folder: Path) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


def expected_bundle_bytes(artifact, module=None) -> int:
    """The artifact's size where it is already on disk (LiteRT writes it in scratch); otherwise the
    bytes of the module's parameters and buffers (Core AI holds the program in memory; palettized
    int8 stores less than that, so the estimate errs on the safe side)."""
    if isinstance(artifact, (str, os.PathLike)) and os.path.exists(artifact):
        path = Path(artifact)
        return folder_bytes(path) if path.is_dir() else path.stat().st_size
    if module is not None and hasattr(module, "parameters"):
        tensors = itertools.chain(module.parameters(), module.buffers())
        return sum(t.numel() * t.element_size() for t in tensors)
    return 0


def ensure_free_space(folder: Path, expected_bytes: int) -> None:
    """Refuse to save when the bundle's filesystem cannot hold it (checked before save, so a full disk
    never gets as far as a toolchain that aborts on it)."""
    needed = int(expected_bytes * SPACE_MARGIN) + SPACE_SLACK_BYTES
    free = free_bytes(folder)
    if free < needed:
        raise disk_full_error(folder, needed=needed, free=free)


class DiskFull(ZooError):
    """Not enough space for the bundle; raised through the pipeline (never recorded as a failed bundle)."""


def is_disk_full(exc: BaseException | None) -> bool:
    """DiskFull, or ENOSPC (or a quota) anywhere in the exception's chain: toolchains often wrap the OSError."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DiskFull) or (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def disk_full_error(folder: Path, needed: int | None = None, free: int | None = None,
                    cause: BaseException | None = None) -> DiskFull:
    """The one message for a full disk: which folder, how many bytes needed (when known) and free."""
    folder = _full_folder(Path(folder), _failed_filename(cause)) if cause is not None else Path(folder)
    in_temp = _in_zoo_temp_folder(folder) or folder == Path(tempfile.gettempdir())
    if in_temp:
        folder = Path(tempfile.gettempdir())  # not the scratch folder itself, which is gone by now
    filename = _failed_filename(cause)
    if free is None:
        with contextlib.suppress(OSError):
            free = free_bytes(_existing_ancestor(folder))
    need = f"the bundle needs about {_human(needed)} ({needed} bytes)" if needed else "the disk filled up"
    have = f"{free} bytes are free" if free is not None else "free space unknown"
    while_writing = f" (writing {filename} failed: no space left on device)" if filename else ""
    where = ("point TMPDIR at a larger disk" if in_temp
             else "choose another folder with out_dir=PATH (make convert OUT=PATH)")
    return DiskFull(
        f"Not enough disk space in {folder}: {need}, {have}{while_writing}. "
        "Any unfinished bundle was removed; the previous bundle, if any, is untouched.",
        f"free some space on that disk, or {where}.",
    )


def _full_folder(out_folder: Path, filename: str | None) -> Path:
    """Where the disk filled up: the output folder, or the temp folder (scratch, GPU check)."""
    tmp = Path(tempfile.gettempdir())
    if filename:
        path = Path(filename)
        if _is_under(path, out_folder):
            return out_folder
        return tmp if _in_zoo_temp_folder(path) else _existing_ancestor(path.parent)
    with contextlib.suppress(OSError):  # no file name in the error: the fuller of the two is the suspect
        return min((out_folder, tmp), key=lambda f: free_bytes(_existing_ancestor(f)))
    return out_folder


def _in_zoo_temp_folder(path: Path) -> bool:
    """Inside one of our zoo-scratch-/zoo-gpu- folders in the system temp dir (not merely under /tmp)."""
    try:
        first = path.resolve().relative_to(Path(tempfile.gettempdir()).resolve()).parts[:1]
    except ValueError:
        return False
    return bool(first) and TEMP_FOLDER.match(first[0]) is not None


def _failed_filename(exc: BaseException | None) -> str | None:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.filename:
            return os.fsdecode(exc.filename)
        exc = exc.__cause__ or exc.__context__
    return None


def _existing_ancestor(path: Path) -> Path:
    for folder in (path, *path.parents):
        if folder.exists():
            return folder
    return path


def _is_under(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def _human(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.1f} MiB"


# ---------------------------------------------------------------- swap


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


@functools.cache
def _renameat2():
    """libc's renameat2, or None where it does not exist (glibc < 2.28, musl < 1.2.?, not Linux)."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def exchange_paths(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically. False where the system cannot (the caller falls back)."""
    fn = _renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):  # old kernel, or a filesystem without exchange
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def _sync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        _fsync_path(folder, os.O_RDONLY | os.O_DIRECTORY)


# ---------------------------------------------------------------- lock


def lock_path(final: Path) -> Path:
    return final.with_name(f".{final.name}.lock")


def acquire_bundle_lock(final: Path, no_wait: bool, say) -> int:
    """An exclusive flock on the bundle's sibling lock file; returns its fd. The holder's PID is
    written into the file so that a waiting run can say whom it waits for."""
    fd = os.open(lock_path(final), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _lock_holder(fd)
            who = f"another zoo run (PID {holder})" if holder else "another zoo run"
            if no_wait:
                raise ZooError(
                    f"{who[0].upper() + who[1:]} is writing the bundle {final}.",
                    "wait for it to finish, or leave out no_wait=true to wait for it automatically.",
                ) from None
            say(f"waiting for {who}, which is writing {final} ...")
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _lock_holder(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).split()[0])
    except (OSError, ValueError, IndexError):
        return None


def release_bundle_lock(fd: int) -> None:
    # The lock file stays: deleting it would let a third run lock a new inode while a second still
    # waits on the old one.
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


# ---------------------------------------------------------------- recovery


def recover_leftovers(final: Path) -> list[str]:
    """Put right what a killed run left next to `final` (call under the bundle's lock); say what was done."""
    notes = []
    for dest in (final, final.with_name(final.name + ".failed")):
        notes += _recover_retired(dest)
    for staging in _siblings(final, ".tmp-"):
        _remove(staging)
        notes.append(f"removed {staging.name}, a staging folder left by a killed or crashed run")
    return notes


def _recover_retired(dest: Path) -> list[str]:
    notes = []
    retired = sorted(_siblings(dest, ".old-"), key=lambda p: p.stat().st_mtime, reverse=True)
    if retired and not os.path.lexists(dest):
        # A run was killed between the two renames of the fallback swap: the previous bundle goes back.
        os.rename(retired[0], dest)
        notes.append(f"restored {dest} from {retired[0].name} (a run was killed in the middle of its swap)")
        retired = retired[1:]
    for path in retired:
        _remove(path)
        notes.append(f"removed {path.name}, a replaced bundle that a killed run had not yet deleted")
    return notes


def _siblings(final: Path, mark: str) -> list[Path]:
    return sorted(final.parent.glob(f".{glob.escape(final.name)}{mark}*"))


def remove_stale_temp_folders(tmp_dir: Path | None = None) -> list[str]:
    """Remove zoo-scratch-<pid>-* / zoo-gpu-<pid>-* (and friends) whose process is gone; say so."""
    tmp_dir = Path(tmp_dir or tempfile.gettempdir())
    notes = []
    with contextlib.suppress(OSError), os.scandir(tmp_dir) as entries:
        for entry in entries:
            m = TEMP_FOLDER.match(entry.name)
            if not m or not entry.is_dir(follow_symlinks=False) or pid_alive(int(m.group(2))):
                continue
            try:
                shutil.rmtree(entry.path)
            except FileNotFoundError:
                continue  # another run removed it first
            except OSError:
                continue  # not ours to remove (another user's, say): leave it
            pid = m.group(2)
            notes.append(f"removed {entry.path}, a temporary folder left by zoo run PID {pid} (no longer running)")
    return notes


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def temp_prefix(kind: str) -> str:
    """Prefix of a temporary folder that names its owner, e.g. zoo-scratch-1234- (see TEMP_FOLDER)."""
    return f"zoo-{kind}-{os.getpid()}-"


# ---------------------------------------------------------------- signals and test hooks


class Terminated(SystemExit):
    """SIGTERM, raised in the main thread so `finally` and `except BaseException` blocks clean up."""


@contextlib.contextmanager
def sigterm_raises():
    """While active, SIGTERM raises Terminated (exit 143) instead of killing the process outright."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread; the main thread's stays
        return

    def raise_terminated(signum, _frame):
        raise Terminated(128 + signum)

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def pause_here_for_tests(point: str) -> None:
    """Fault-injection hook: with ZOO_TEST_PAUSE_AT naming `point`, write the marker file and wait
    until it is deleted (or ten minutes pass), so a test can kill the run at exactly this point."""
    points = os.environ.get(PAUSE_AT_ENV, "")
    if point not in points.split(","):
        return
    marker = Path(os.environ.get(PAUSE_MARKER_ENV) or Path(tempfile.gettempdir()) / f"zoo-paused-{os.getpid()}")
    atomic_write_bytes(marker, f"{os.getpid()} {point}\n".encode())
    deadline = time.monotonic() + 600
    while marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _say_to_stderr(message: str) -> None:
    print(f"zoo: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- writer


class BundleWriter:
    """Stage a bundle next to its final place; `commit` swaps it in, `reject` sets it aside.

    Creating one takes the bundle's lock (waiting, or ZooError with `no_wait`), recovers leftovers
    of killed runs (`recovered` lists what was done) and makes the staging folder. As a context
    manager it also turns SIGTERM into an exception, removes the staging folder on any error, and
    turns a full disk into a ZooError.
    """

    def __init__(self, final: Path, *, no_wait: bool = False, say=None):
        self.final = Path(final)
        self._say = say or _say_to_stderr
        self._retired: Path | None = None  # the live bundle while the fallback swap is between its renames
        self._retired_dest: Path | None = None
        self._open = True  # staging holds an unfinished bundle
        self._committed = False
        safe_out_dir(self.final.parent)
        ensure_writable(self.final.parent)
        self._lock_fd: int | None = acquire_bundle_lock(self.final, no_wait, self._say)
        try:
            self.recovered = recover_leftovers(self.final) + remove_stale_temp_folders()
            for note in self.recovered:
                self._say(note)
            self.staging = Path(tempfile.mkdtemp(prefix=f".{self.final.name}.tmp-{os.getpid()}-",
                                                 dir=self.final.parent))
            os.chmod(self.staging, 0o777 & ~_umask())  # mkdtemp makes it 0700; a bundle is an ordinary folder
        except BaseException as exc:
            self._unlock()
            if is_disk_full(exc):
                raise disk_full_error(self.final.parent, cause=exc) from exc
            raise
        self._signals = contextlib.ExitStack()

    # -- context manager

    def __enter__(self) -> "BundleWriter":
        self._signals.enter_context(sigterm_raises())
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if self._open:
                self.discard()
            else:  # after an exchange the retired bundle may still sit at the staging path
                shutil.rmtree(self.staging, ignore_errors=True)
            if isinstance(exc, (Terminated, KeyboardInterrupt)) and not self._committed:
                self._say(f"interrupted: removed the unfinished bundle; {self._previous_state()}")
        finally:
            self._unlock()
            self._signals.close()
        if exc is not None and not isinstance(exc, ZooError) and is_disk_full(exc):
            raise disk_full_error(self.final.parent, cause=exc) from exc
        return False

    # -- outcomes

    def commit(self) -> Path:
        """Make the staged bundle live (see the module docstring for how the swap has no gap)."""
        self._replace(self.final)
        return self.final

    def reject(self) -> Path:
        """Keep a bundle that failed its gates for inspection, away from the good one."""
        failed = self.final.with_name(self.final.name + ".failed")
        self._replace(failed)
        return failed

    def discard(self) -> None:
        if self._retired is not None and not os.path.lexists(self._retired_dest):
            os.rename(self._retired, self._retired_dest)  # interrupted between the fallback's renames
            self._retired = None
        shutil.rmtree(self.staging, ignore_errors=True)
        self._open = False
        self._unlock()

    # -- internals

    def _replace(self, dest: Path) -> None:
        sync_tree(self.staging)
        if not os.path.lexists(dest):
            os.rename(self.staging, dest)
        elif exchange_paths(self.staging, dest):
            # dest now holds the new bundle; the retired one sits at the staging path.
            self._open, self._committed = False, dest == self.final
            pause_here_for_tests("swap")
            shutil.rmtree(self.staging, ignore_errors=True)
        else:
            # Fallback where renameat2 is unavailable: a gap between two renames, covered by recovery
            # (an .old-* folder with no live bundle goes back into place on the next run).
            self._retired, self._retired_dest = dest.with_name(f".{dest.name}.old-{os.getpid()}"), dest
            os.rename(dest, self._retired)
            pause_here_for_tests("swap")
            os.rename(self.staging, dest)
            retired, self._retired = self._retired, None
            shutil.rmtree(retired, ignore_errors=True)
        _sync_dir(dest.parent)
        self._open, self._committed = False, dest == self.final
        self._unlock()

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            release_bundle_lock(self._lock_fd)
            self._lock_fd = None

    def _previous_state(self) -> str:
        return (f"the previous bundle at {self.final} is untouched" if self.final.exists()
                else f"there was no previous bundle at {self.final}")
