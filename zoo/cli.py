"""One error boundary for every command-line tool: bad input exits 2 with one paragraph, a bug keeps its
traceback.

Each CLI (zoo.convert, zoo.generate, zoo.bench, zoo.verify, `python -m zoo.targets.litert_gpu`) runs its
work inside `error_boundary()` (or decorates its `main(argv) -> int` with `@returns_exit_code`). Both
call `report_error`, which prints a ZooError as "error: <problem> Fix: <fix>" and returns its exit code.
Exceptions that are *known to come from the user's input* — an override Hydra cannot parse, a config
value of the wrong type, a file that is not there, JSON that does not parse, a pickle that is not a
checkpoint — are translated into ZooErrors first (`as_zoo_error`). Everything else propagates with its
traceback: that is a bug, and hiding it would cost the person who has to fix it.

Hydra: `@hydra.main` catches exceptions itself (prints them, exits 1), and parses the command line before
our task function runs. So `check_overrides` parses and composes the overrides with Hydra's own parser
and compose API first, inside the boundary, for every job of a multirun sweep; what Hydra would have
refused is refused here, as a ZooError, before Hydra starts.
"""

from __future__ import annotations

import contextlib
import functools
import json
import pickle
import sys
from typing import NoReturn

from zoo.errors import ZooError

MAX_COMPOSED_JOBS = 64  # a sweep larger than this is checked on its first 64 combinations
OVERRIDE_GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic/"


# ---------------------------------------------------------------- the boundary


def report_error(exc: BaseException, console=None) -> int | None:
    """Print a known error as one paragraph and return its exit code; None for anything else (a bug)."""
    error = as_zoo_error(exc)
    if error is None:
        return None
    if console is None:
        from zoo.console import Console

        console = Console()
    sys.stdout.flush()
    console.error(error)
    return error.exit_code


@contextlib.contextmanager
def error_boundary(console=None):
    """`with error_boundary(): ...` — a known error ends the process with its exit code (2 for bad input);
    an unknown one is re-raised unchanged, traceback and all."""
    try:
        yield
    except Exception as exc:
        code = report_error(exc, console)
        if code is None:
            raise
        raise SystemExit(code) from None


# ---------------------------------------------------------------- ending a process


def native_runtime_loaded() -> bool:
    """Whether this process loaded the Core AI runtime, whose Swift worker threads call into Python."""
    return "coreai.runtime" in sys.modules


def end_process(code=0) -> NoReturn:
    """Exit with `code` (an int, None for 0, or a message for 1), skipping interpreter finalization
    when the Core AI runtime is loaded.

    Why: the runtime completes its async calls on libdispatch worker threads that drop references to
    Python objects (PyGILState_Ensure) some time after the call returned. If that lands while CPython 3.11
    finalizes, CPython ends the thread with pthread_exit, whose forced unwind hits Swift's exception
    personality and aborts the process (SIGABRT, "C++ exception handling detected but the Swift runtime
    was compiled with exceptions disabled") — after the command had printed its result. Measured: 11 of
    30 `zoo.generate` runs on a tiny Core AI bundle died so; gdb shows a DispatchWorker thread in
    take_gil -> PyThread_exit_thread. atexit handlers run here first, while those threads can still
    take the GIL; then the process ends without finalizing."""
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    code = 0 if code is None else int(code)
    if not native_runtime_loaded():
        sys.exit(code)
    import atexit
    import os

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_script(main, *args) -> NoReturn:
    """`if __name__ == "__main__": run_script(main, argv)`: main's return value or SystemExit code
    becomes the exit status, through `end_process`."""
    try:
        code = main(*args)
    except SystemExit as exc:
        code = exc.code
    end_process(code)


def returns_exit_code(main):
    """Decorate `main(argv) -> int`: a known error is printed and its exit code returned (so in-process
    callers and tests get a number, not a SystemExit); unknown ones propagate."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except Exception as exc:
            code = report_error(exc)
            if code is None:
                raise
            return code

    return wrapper


@contextlib.contextmanager
def translated_errors():
    """Inside a Hydra job: re-raise known errors as ZooErrors, for code that already handles ZooError
    (a multirun job records its code instead of exiting)."""
    try:
        yield
    except ZooError:
        raise
    except Exception as exc:
        error = as_zoo_error(exc)
        if error is None:
            raise
        raise error from exc


# ---------------------------------------------------------------- translations


def as_zoo_error(exc: BaseException) -> ZooError | None:
    """The ZooError a known exception means, or None if it is not known to come from user input."""
    if isinstance(exc, ZooError):
        return exc
    for kinds, translate in _translations():
        if isinstance(exc, kinds):
            error = translate(exc)
            if error is not None:
                return error
    return None


def _translations():
    """(exception types, translator), most specific first. Imported lazily: a CLI that never touches
    Hydra does not pay for importing it."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
    from omegaconf.errors import MissingMandatoryValue, ValidationError

    return [
        ((OverrideParseException,), _override_parse_error),
        ((MissingConfigException,), _missing_config_error),
        ((ConfigCompositionException,), _composition_error),
        ((ValidationError,), _config_type_error),
        ((MissingMandatoryValue,), _missing_value_error),
        ((pickle.UnpicklingError,), _unpickling_error),
        ((json.JSONDecodeError,), _json_error),
        ((FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError), _path_error),
    ]


def _first_lines(text: str, skip=("See https://", "Set the environment variable")) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip() and not line.strip().startswith(skip)]
    return " ".join(lines)


def _override_parse_error(exc) -> ZooError:
    reason = _first_lines(getattr(exc, "message", "") or str(exc))
    reason = reason.replace(f"Error parsing override '{exc.override}'", "").strip() or "syntax error"
    return ZooError(
        f"Cannot parse the command-line override '{exc.override}' ({reason}).",
        "write each override as key=value (e.g. model=t5 target=litert precision=fp32); quote a value that holds "
        f"brackets, commas or spaces, e.g. \"weights='local:/data/[v2]'\" ({OVERRIDE_GRAMMAR}).",
    )


def _missing_config_error(exc) -> ZooError:
    # Hydra: "In 'convert': Could not find 'model/'" for `model=`, 'model/nope' for `model=nope`.
    missing = str(getattr(exc, "missing_cfg_file", "") or "")
    group, _, choice = missing.partition("/")
    options = list(getattr(exc, "options", None) or [])
    if not group:
        return ZooError(_first_lines(str(exc).split("Config search path")[0]), "check the config group overrides.")
    problem = f"'{group}=' needs a value." if not choice else f"Unknown {group} '{choice}'."
    if options:
        problem += f" Valid: {', '.join(options)}."
    return ZooError(problem, f"pick one of those, e.g. {group}={options[0] if options else '...'}.")


def _composition_error(exc) -> ZooError:
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    cause, message = exc.__cause__, _first_lines(str(exc))
    if isinstance(cause, ValidationError):
        return _config_type_error(cause, override=message.replace("Error merging override", "").strip())
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
        key = getattr(cause, "full_key", None) or "?"
        return ZooError(f"Unknown config key '{key}' ({str(exc).splitlines()[0].rstrip('.')}).",
                        "check its spelling against the model's config.yaml (`zoo convert --cfg job` prints the whole "
                        f"config); to add a new key on purpose write +{key}=VALUE.")
    return ZooError(f"The configuration could not be composed: {message}",
                    "fix the override named above (`zoo convert --help` lists the config groups; sweeps need -m).")


def _config_type_error(exc, override: str = "") -> ZooError:
    key = getattr(exc, "full_key", None) or "?"
    reason = str(exc).splitlines()[0]
    given = f" (from `{override}`)" if override else ""
    return ZooError(f"Config value of the wrong type at '{key}'{given}: {reason}.",
                    f"give {key} a value of its type; the model's config.yaml shows the default "
                    "(`zoo convert --cfg job` prints the composed config).")


def _missing_value_error(exc) -> ZooError:
    key = getattr(exc, "full_key", None) or "?"
    return ZooError(f"The config key '{key}' has no value ('???' means: must be given).",
                    f"pass it on the command line, e.g. {key}=VALUE.")


def _unpickling_error(exc) -> ZooError:
    # torch's weights_only message suggests `weights_only=False`, i.e. executing the file's code: never advice.
    return ZooError("A file could not be read as a PyTorch checkpoint: it is not a pickle of plain tensors "
                    f"({type(exc).__name__}).",
                    "it is not a valid checkpoint: re-download it, or convert it to .safetensors with the tool that "
                    "wrote it; do not load it with weights_only=False (that runs code from the file).")


def _json_error(exc) -> ZooError:
    return ZooError(f"A JSON file is malformed (line {exc.lineno} column {exc.colno}: {exc.msg}).",
                    "restore the file from its source (a bundle: re-download or re-convert it).")


def _path_error(exc: OSError) -> ZooError:
    path = exc.filename if exc.filename is not None else "?"
    if isinstance(exc, FileNotFoundError):
        return ZooError(f"{path} does not exist.", "check the path (spelling, current folder) and try again.")
    if isinstance(exc, IsADirectoryError):
        return ZooError(f"{path} is a folder where a file was expected.", "pass the file inside it, not the folder.")
    if isinstance(exc, NotADirectoryError):
        return ZooError(f"{path} is a file where a folder was expected (or a path goes through a file).",
                        "pass a folder path.")
    return ZooError(f"Permission denied: {path}.", "fix its permissions, or pass a path you can read and write.")


# ---------------------------------------------------------------- Hydra, before Hydra


def hydra_overrides(argv: list[str]) -> tuple[list[str], bool]:
    """(the overrides, multirun?) exactly as `@hydra.main` will read them from this command line."""
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_args(argv)
    return list(args.overrides or []), bool(args.multirun)


def check_overrides(argv: list[str]) -> None:
    """Parse and compose the convert config for every job the command line asks for, so any override
    Hydra would refuse (syntax, unknown key, wrong type, empty group) is refused here, as a ZooError.
    Raises Hydra's / OmegaConf's exceptions; the boundary translates them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from zoo.config import compose_convert

    overrides, multirun = hydra_overrides(argv)
    parsed = OverridesParser.create().parse_overrides(overrides)
    for job in (_sweep_jobs(parsed) if multirun else [overrides])[:MAX_COMPOSED_JOBS]:
        require_consistent_model_config(compose_convert(job).model, job)


def require_consistent_model_config(model_cfg, job: list[str]) -> None:
    """The schema's cross-key checks (zoo/schema.py `check_semantics`) once more, after the overrides:
    types are enforced by Hydra, but e.g. `model.variant=nope` is only found out deep in the pipeline
    (an omegaconf KeyError, reported by Hydra with a traceback)."""
    from zoo.schema import check_semantics
    from zoo.targets import TARGET_PRECISIONS

    problems = check_semantics(model_cfg, TARGET_PRECISIONS)
    if problems:
        given = " ".join(o for o in job if o.startswith(("model.", "+model.", "~model."))) or " ".join(job)
        raise ZooError(f"With the overrides `{given}` the model config is inconsistent: {'; '.join(problems)}.",
                       "change those overrides (the model's config.yaml shows the valid values).")


def _sweep_jobs(parsed) -> list[list[str]]:
    """Every combination of a multirun sweep, as Hydra's basic sweeper will make them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.errors import HydraException

    try:
        return BasicSweeper.split_arguments(parsed, None)[0]
    except HydraException:  # a sweep type the basic sweeper cannot expand (e.g. range): check the fixed part
        return [[o.input_line for o in parsed if not o.is_sweep_override()]]
