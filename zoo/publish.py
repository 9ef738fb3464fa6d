"""`python -m zoo.publish MODEL [--component C] [--target T] [--precision P] [--repo ORG/NAME]
[--revision BRANCH] [--private] [--dry-run | --stage-only DIR] [--force] [--exports DIR]`

Stages the chosen verified bundles of one model (from `exports/<model>/...`) plus a generated model card
into one folder, and uploads that folder to the Hugging Face Hub:

- every bundle's manifest hashes are re-checked on disk first, and the bundle must hold exactly the files
  its manifest lists (nothing added after verification, no links);
- refused, always: a bundle whose gates failed or that errored (they are kept aside, never published),
  and a bundle whose files do not match its manifest;
- refused unless `--force`: bundles made from tiny or random weights; `--force` stamps the card with a
  warning banner;
- only regular files inside the staged folder are uploaded (no symlinks, no `.failed` bundles);
- the token comes from HF_TOKEN or `hf auth login` and is never printed or written anywhere;
- small uploads are one commit; a large one goes through huggingface_hub's upload_folder, which with hf-xet
  is the resumable multi-commit pipeline (`hf upload-large-folder` in older releases). Both resume when
  re-run: the Hub skips objects it already holds (LFS batch / Xet dedup), so only missing files are sent.

`--dry-run` stages into a temporary folder, prints the files, the card and the target repo, and uploads
nothing; `--stage-only DIR` leaves the staged folder in DIR. Exit 0: done; 2: refused or failed (one
paragraph with the fix).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from zoo import integrity
from zoo.bundle import MANIFEST, REPORT
from zoo.catalog_entry import CATALOG_FOLDER, write_catalog_entries
from zoo.errors import ZooError

LARGE_UPLOAD_BYTES = 2 * 2**30   # above this (or LARGE_UPLOAD_FILES), the resumable multi-commit path
LARGE_UPLOAD_FILES = 200
SKIPPED_SUFFIXES = (".failed",)  # and hidden staging/retired folders (.name.tmp-*, .name.old-*)


@dataclass
class Bundle:
    folder: Path        # where it lies on disk
    rel: str            # its folder in the published repo
    manifest: dict
    report: dict
    bytes: int
    multi_component: bool = False


# ---------------------------------------------------------------- finding and checking bundles


def find_bundles(exports: Path, model: str, components: list[str], multi: bool, targets: list[str],
                 precision: str | None) -> list[Bundle]:
    """The bundles on disk for this model/components/targets (and precision, if given), sorted."""
    root = exports / model
    found = []
    for component in components:
        base = root / component if multi else root
        for target in targets:
            pattern = f"{target}-{precision}" if precision else f"{target}-*"
            for folder in sorted(base.glob(pattern)):
                if folder.name.startswith(".") or folder.name.endswith(SKIPPED_SUFFIXES) or not folder.is_dir():
                    continue
                rel = f"{component}/{folder.name}" if multi else folder.name
                found.append(load_bundle(folder, rel, multi))
    if not found:
        raise ZooError(
            f"No bundles of '{model}' under {root} for target(s) {', '.join(targets)}"
            f"{' at ' + precision if precision else ''}.",
            f"convert first: `python -m zoo.convert model={model}` (or pass --exports DIR where they are).",
        )
    return found


def load_bundle(folder: Path, rel: str, multi: bool) -> Bundle:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        report = json.loads((folder / REPORT).read_text())
    except (OSError, ValueError) as exc:
        raise ZooError(f"{folder} is not a complete bundle ({type(exc).__name__}: {exc}).",
                       "re-run the conversion for it; bundles hold manifest.json and report.json.") from exc
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
    return Bundle(folder, rel, manifest, report, size, multi)


# merge: replace with zoo.integrity.verify_bundle
def recheck_bundle_hashes(folder: Path, allow_links: bool = False) -> list[str]:
    """Problems with a bundle's bytes versus its manifest (empty: it is what was verified): every listed
    file re-hashed, nothing unlisted, no symlinks (`allow_links`: a bundle read back from the HF cache)."""
    return integrity.inspect_bundle(folder, exact_contents=True, allow_links=allow_links).problems


def refusals(bundle: Bundle) -> tuple[list[str], list[str]]:
    """(hard refusals, refusals that --force overrides) for one bundle."""
    hard, soft = [], []
    m = bundle.manifest
    if m.get("status") != "passed" or not all(g.get("passed") for g in m.get("gates", [])):
        failed = [f"{g['metric']} {g['output']}" for g in m.get("gates", []) if not g.get("passed")]
        hard.append(f"{bundle.rel}: status '{m.get('status')}'" + (f", failed gates: {', '.join(failed)}" if failed else ""))
    hard += [f"{bundle.rel}: {p}" for p in recheck_bundle_hashes(bundle.folder)]
    if not m.get("real_weights"):
        soft.append(f"{bundle.rel}: made from {(m.get('weights') or {}).get('source', 'unknown')} weights")
    return hard, soft


# ---------------------------------------------------------------- staging


def stage(bundles: list[Bundle], card_text: str, dest: Path) -> list[Path]:
    """Copy (hard-link where possible) every bundle file and the card into `dest`. Returns the files."""
    dest.mkdir(parents=True, exist_ok=True)
    for bundle in bundles:
        for source in sorted(p for p in bundle.folder.rglob("*") if p.is_file() and not p.is_symlink()):
            target = dest / bundle.rel / source.relative_to(bundle.folder)
            target.parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(source, target)
    (dest / "README.md").write_text(card_text)
    return staged_files(dest)


def _link_or_copy(source: Path, target: Path) -> None:
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)  # multi-GB bundles: no second copy on the same filesystem
    except OSError:
        shutil.copy2(source, target)


def staged_files(folder: Path) -> list[Path]:
    """Every file that will be uploaded: regular files whose real path is inside `folder`, nothing else."""
    root = folder.resolve()
    files = []
    for path in sorted(folder.rglob("*")):
        if path.is_symlink() or (path.exists() and root not in path.resolve().parents):
            raise ZooError(f"{path} in the staged folder is a link or points outside it.",
                           "stage again (zoo.publish --stage-only DIR) into an empty folder; never link files into it.")
        if path.is_file():
            files.append(path)
    return files


# ---------------------------------------------------------------- uploading


def hub_token() -> str:
    from huggingface_hub import get_token

    token = get_token()
    if not token:
        raise ZooError("No Hugging Face token: publishing needs a write token.",
                       "run `hf auth login` (or set HF_TOKEN=hf_... in the environment), then re-run.")
    return token


# The ecosystem's repo naming: coreai-catalog lists 99 of its 110 artifacts in repos named `<Model>-CoreAI`
# (toolchain.md §5); LiteRT bundles follow the same shape with the target's own name.
REPO_SUFFIX = {"coreai": "CoreAI", "litert": "LiteRT"}


def base_model_id(cfg, bundles: list[Bundle]) -> str | None:
    """The upstream Hub id the bundles were made from: their weights' repo, else the config variant's."""
    variant = (cfg.get("variants") or {}).get(cfg.get("variant") or "", {}) or {}
    hub_weights = next((b.manifest["weights"] for b in bundles if (b.manifest.get("weights") or {}).get("repo_id")), None)
    return (hub_weights or {}).get("repo_id") or (variant.get("hub") or {}).get("repo_id")


def repo_model_name(cfg, spec, bundles: list[Bundle]) -> str:
    """`<Model>` of the repo name: the upstream model's own name (SmolLM2-135M-Instruct) for real weights;
    `<zoo name>-<source>` (gqa-llm-tiny) for tiny/random ones, which must never pass for the real model."""
    fake = sorted({str(b.manifest.get("weights", {}).get("source")) for b in bundles if not b.manifest.get("real_weights")})
    if fake:
        return f"{spec.name}-{'-'.join(fake)}"
    base = base_model_id(cfg, bundles)
    return base.rsplit("/", 1)[-1] if base else spec.name


def default_repo(model_name: str, target: str, api=None) -> str:
    """`<your user>/<Model>-CoreAI` or `<your user>/<Model>-LiteRT`; without a reachable Hub, a placeholder
    that says so."""
    name = f"{model_name}-{REPO_SUFFIX[target]}"
    if api is None:
        return f"<your Hub user>/{name}"
    return f"{api.whoami()['name']}/{name}"


def upload(api, repo_id: str, folder: Path, files: list[Path], revision: str | None, private: bool, message: str) -> str:
    """Create the repo (and branch), upload the staged folder, return the commit URL."""
    from huggingface_hub import CommitOperationAdd

    api.create_repo(repo_id, private=private, exist_ok=True)
    if revision and revision != "main":
        api.create_branch(repo_id, branch=revision, exist_ok=True)
    total = sum(p.stat().st_size for p in files)
    if total > LARGE_UPLOAD_BYTES or len(files) > LARGE_UPLOAD_FILES:
        info = api.upload_folder(repo_id=repo_id, folder_path=folder, revision=revision, commit_message=message)
    else:
        operations = [CommitOperationAdd(path_in_repo=p.relative_to(folder).as_posix(), path_or_fileobj=str(p))
                      for p in files]
        info = api.create_commit(repo_id, operations, commit_message=message, revision=revision)
    return str(getattr(info, "commit_url", info))


# ---------------------------------------------------------------- the command


def build_card(cfg, spec, bundles: list[Bundle], repo_id: str, forced: bool):
    from zoo.card import model_card

    base_model = base_model_id(cfg, bundles)
    return model_card(spec.name, spec.summary, bundles, repo_id, base_model, spec.pipeline_tag, spec.license,
                      _model_folder(cfg) / "README.md", forced)


def _model_folder(cfg) -> Path:
    import importlib

    return Path(importlib.import_module(cfg.package).__file__).parent


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(prog="zoo publish", description=__doc__.split("\n\n")[1])
    parser.add_argument("model")
    parser.add_argument("--component", action="append", help="repeatable; default every component")
    parser.add_argument("--target", default="all", choices=["coreai", "litert", "all"])
    parser.add_argument("--precision", help="fp32|fp16|bf16|int8; default every verified bundle found")
    parser.add_argument("--repo", help="ORG/NAME on the Hub (default: one repo per target, <your user>/<Model>-CoreAI "
                                       "and <your user>/<Model>-LiteRT)")
    parser.add_argument("--revision", help="branch to commit to (created if missing; default main)")
    parser.add_argument("--private", action="store_true", help="create the repo private")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="stage in a temp folder, print, upload nothing")
    mode.add_argument("--stage-only", metavar="DIR", type=Path, help="stage into DIR and stop")
    parser.add_argument("--force", action="store_true",
                        help="publish bundles made from tiny/random weights (the card carries a warning banner)")
    parser.add_argument("--exports", type=Path, default=Path("exports"), help="where the bundles are (default exports)")
    return parser.parse_args(argv)


def run(args, out=print) -> int:
    from zoo.registry import get_spec, load_model_config

    cfg = load_model_config(args.model)
    spec = get_spec(cfg)
    components = args.component or [c.name for c in spec.components]
    for name in components:
        spec.component(name)  # unknown component: one clear error
    targets = ["coreai", "litert"] if args.target == "all" else [args.target]
    bundles = find_bundles(args.exports, spec.name, components, len(spec.components) > 1, targets, args.precision)
    hard, soft = [], []
    for bundle in bundles:
        h, s = refusals(bundle)
        hard, soft = hard + h, soft + s
    if hard:
        raise ZooError("Refusing to publish: " + "; ".join(hard) + ".",
                       "re-convert those bundles (`python -m zoo.convert ...`) and publish only verified ones; "
                       "failed or modified bundles are never published, --force does not change that.")
    forced = bool(soft) and args.force
    preview = args.dry_run
    if soft and not args.force and not preview:
        raise _tiny_weights_refusal(soft)
    api = None if preview or args.stage_only else _api()  # staging needs no token and no network
    if args.stage_only and args.stage_only.exists() and any(args.stage_only.iterdir()):
        raise ZooError(f"--stage-only {args.stage_only} is not empty.", "pass an empty or new folder.")
    if args.repo:
        publish_to(args, cfg, spec, bundles, args.repo, forced, api, out, args.stage_only)
    else:  # the ecosystem's layout: one repo per target (<Model>-CoreAI, <Model>-LiteRT)
        name = repo_model_name(cfg, spec, bundles)
        groups = {t: [b for b in bundles if b.manifest.get("target") == t] for t in REPO_SUFFIX}
        groups = {t: g for t, g in groups.items() if g}
        for target, group in groups.items():
            repo_id = default_repo(name, target, api)
            # --stage-only with several repos: one subfolder per repo, named like it.
            stage_dir = args.stage_only and (args.stage_only / repo_id.rsplit("/", 1)[-1] if len(groups) > 1
                                             else args.stage_only)
            publish_to(args, cfg, spec, group, repo_id, forced, api, out, stage_dir)
    if soft and not args.force:  # a preview shows every plan first, then refuses
        raise _tiny_weights_refusal(soft)
    return 0


def publish_to(args, cfg, spec, bundles: list[Bundle], repo_id: str, forced: bool, api, out,
               stage_dir: Path | None) -> int:
    """Stage `bundles` with their card into one repo (into `stage_dir` if given), and upload unless staging
    or previewing."""
    preview = args.dry_run
    card = build_card(cfg, spec, bundles, repo_id, forced)
    with tempfile.TemporaryDirectory(prefix="zoo-publish-") as scratch:
        folder = stage_dir or Path(scratch) / "stage"
        files = stage(bundles, str(card), folder)
        catalog_files = write_catalog_entries(bundles, spec, repo_id, folder)  # one per Core AI bundle
        if catalog_files:
            files = staged_files(folder)
        _print_plan(out, repo_id, args.revision, folder, files, str(card), preview or bool(stage_dir))
        if preview or stage_dir:
            out(f"{'dry run' if preview else 'staged in ' + str(folder)}: nothing uploaded.")
            return 0
        try:
            url = upload(api, repo_id, folder, files, args.revision, args.private,
                         f"zoo.publish {spec.name}: {', '.join(b.rel for b in bundles)}")
        except ZooError:
            raise
        except Exception as exc:
            from zoo.hub import explain_hub_error

            raise explain_hub_error(exc, repo_id, args.revision, action="upload") from exc
    if catalog_files:  # the entries cannot name the commit that contains them: the contributor adds it
        out(f"coreai-catalog entries: {CATALOG_FOLDER}/ in the repo; set artifact.huggingface.revision to this "
            f"commit ({url.rstrip('/').rsplit('/', 1)[-1]}) before `coreai-catalog contribute`.")
    out(f"published: {url}")  # the last line: scripts read the commit URL from it
    return 0


def _api():
    from huggingface_hub import HfApi

    return HfApi(token=hub_token())


def _tiny_weights_refusal(soft: list[str]) -> ZooError:
    return ZooError("Refusing to publish bundles made from tiny/random weights: " + "; ".join(soft) + ".",
                    "convert with real weights (WEIGHTS=hub, local:PATH or embedded) and publish those, or pass "
                    "--force to publish these as test artifacts (the card then carries a warning banner).")


def _print_plan(out, repo_id: str, revision: str | None, folder: Path, files: list[Path], card: str, show_card: bool):
    total = sum(p.stat().st_size for p in files)
    out(f"target repo: {repo_id} (branch {revision or 'main'})")
    out(f"staged files ({len(files)}, {total / 2**20:.2f} MiB):")
    for path in files:
        out(f"  {path.relative_to(folder).as_posix():<60} {path.stat().st_size:>12,} B")
    if show_card:
        out("----- README.md (model card) -----")
        out(card.rstrip())
        out("----- end of model card -----")


def main(argv: list[str] | None = None) -> int:
    from zoo.cli import returns_exit_code  # the one error boundary every CLI uses

    return returns_exit_code(lambda: run(parse_args(argv)))()


if __name__ == "__main__":
    from zoo.cli import run_script

    run_script(main)
