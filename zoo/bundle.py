"""Bundle folders: built in a temporary sibling, then swapped into place in one rename.

A run that fails or is interrupted at any stage leaves the previous good bundle byte-identical:
nothing ever writes into the live folder. A bundle whose gates fail is moved to `<name>.failed/`
(replacing an older failed one), never over the good one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from zoo.errors import ZooError

REPORT = "report.json"
MANIFEST = "manifest.json"


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
    path.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def ensure_writable(out_dir: Path) -> None:
    """Fail before any work if the output folder cannot be created or written."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise ZooError(
            f"Output folder {out_dir} is not writable ({exc.strerror or exc}).",
            "pass a writable folder with out_dir=PATH (make convert OUT=PATH), or fix its permissions.",
        ) from exc


class BundleWriter:
    """Stage a bundle next to its final place; `commit` swaps it in, `reject` sets it aside."""

    def __init__(self, final: Path):
        self.final = final
        ensure_writable(final.parent)
        self.staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))

    def commit(self) -> Path:
        """Replace the live bundle with the staged one. Two renames; the old one is removed last."""
        retired = None
        if self.final.exists():
            retired = self.final.with_name(f".{self.final.name}.old-{os.getpid()}")
            os.replace(self.final, retired)
        os.replace(self.staging, self.final)
        if retired is not None:
            shutil.rmtree(retired, ignore_errors=True)
        return self.final

    def reject(self) -> Path:
        """Keep a bundle that failed its gates for inspection, away from the good one."""
        failed = self.final.with_name(self.final.name + ".failed")
        if failed.exists():
            shutil.rmtree(failed)
        os.replace(self.staging, failed)
        return failed

    def discard(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
