"""Every command written in README.md and docs/*.md runs here, in a cheap form, so the
documentation cannot drift from the code.

Where commands are found:

- fenced ``bash``, ``sh``, ``shell`` and ``console`` blocks (in ``console`` blocks, the lines that
  start with ``$ ``), lines joined across a trailing backslash, ``# comments`` dropped, split into
  commands at ``&&``, ``||``, ``;`` and ``|``;
- inline code spans outside the blocks that start with ``python`` (after optional ``VAR=value``
  assignments), also when Markdown wraps them over two lines.

How a command line reads:

- ``NAME=value`` alone defines ``$NAME`` for the rest of its block; a ``$NAME`` defined nowhere
  stands for a path the reader fills in and reads as the literal ``NAME``; ``$(...)`` reads as one
  word. ``VAR=value`` before a command (an environment setting) is dropped.
- A bare ``...`` argument stands for "further overrides" and is dropped.
- ``<`` and ``>`` outside quotes are what the shell takes them for, redirections, so they fail: a
  placeholder is written ``$NAME`` or ``/path/to/...``, which the shell leaves alone.

What runs, per program:

- ``python <root script>`` with ``@hydra.main`` or ``@hydra_main`` (the config name is read from the
  decorator): the overrides are composed in-process with Hydra's compose API, which rejects them
  exactly as ``--cfg job`` would, and then checked by ``src.build.check_config``, which every
  command runs before it builds anything (as on a machine with a GPU, which ``trainer=gpu`` is
  written for). Hydra's own flags (``--cfg``, ``--resolve``, ``--package``, ``--info``) are dropped;
  ``-m``/``--multirun`` composes every value of every sweep in turn, the other sweeps at their first
  value. The script's ``split_arguments`` (``translate.py``: the sentences) is applied first.
- ``python <other script>``, ``python -m <module>``: the script runs in-process until its argparse
  parser has parsed the arguments, then stops (``--help`` passes). ``study.py``'s claims must be
  ``conf/study/`` names; ``src.datamodules.check``'s overrides are composed as ``train.py``'s.
- ``python -c``: the code must compile.
- ``pip install -e <path>[extras]``: the path holds a ``pyproject.toml`` declaring the extras.
- ``wandb sweep FILE``: the file exists and is a sweep (``program``/``command`` and ``parameters``).
  ``wandb agent|sync|login`` need a W&B server and are skipped.
- ``pytest``: every path exists and every ``-m`` marker is declared in ``pyproject.toml``.
- ``ruff check [PATH ...]``: ``pyproject.toml`` selects the lint rules and every path exists.
- ``bash``/``sh``/``sbatch``/``source FILE``: the file exists. ``cd DIR``: the folder exists.
- ``git`` and ``echo`` lines are skipped. Any other program fails until it has a rule here.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import re
import runpy
import shlex
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from unittest import mock

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from lightning.pytorch.accelerators import CUDAAccelerator
from omegaconf.errors import OmegaConfBaseException

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_BLOCKS = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)\s*(?P<lang>[\w-]*)")
INLINE = re.compile(r"(?<!`)`([^`\n]+(?:\n[^`\n]+)?)`(?!`)")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
SEPARATORS = {"&&", "||", ";", "|", "&"}
REDIRECTIONS = {"<", ">", ">>", "<<", ">&", "<&", "&>"}
HYDRA_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--info", "-i"}
HYDRA_FLAGS = {"--resolve", "--help", "-h", "--hydra-help", "--shell-completion", "-sc"}
# Hydra's parse and composition errors, OmegaConf's, and the entry points' config checks (their
# UserError subclasses are ValueError, TypeError or OSError)
COMPOSE_ERRORS = (
    HydraException,
    OmegaConfBaseException,
    ValueError,
    TypeError,
    LookupError,
    OSError,
)
SKIPPED_PROGRAMS = {
    "git": "git commands change the checkout, not the project",
    "echo": "prints its arguments",
}


@dataclass(frozen=True)
class Command:
    """One documented command: where it is written and its words, as the shell splits them."""

    source: str  # path relative to the repository root
    line: int
    words: tuple[str, ...]
    text: str  # the line as written, for messages

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"


class CommandError(AssertionError):
    """A documented command that would not run as written."""


# --- reading the documents ------------------------------------------------------------------


def _substitute_commands(text: str) -> str:
    """``$(...)`` (nested parentheses and quotes included) replaced by one word."""
    out, index = [], 0
    while (start := text.find("$(", index)) != -1:
        depth, position, quote = 0, start + 1, None
        while position < len(text):
            char = text[position]
            if quote:
                quote = None if char == quote else quote
            elif char in "'\"":
                quote = char
            elif char == "(":
                depth += 1
            elif char == ")":
                depth -= 1
                if depth == 0:
                    break
            position += 1
        out.append(text[index:start] + "SUBSTITUTED")
        index = position + 1
    out.append(text[index:])
    return "".join(out)


def _expand(text: str, variables: dict[str, str]) -> str:
    return VARIABLE.sub(lambda m: variables.get(m[1] or m[2], m[1] or m[2]), text)


def _split_words(text: str) -> list[str]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars="|&;<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def _commands_of_line(
    source: str, line: int, text: str, variables: dict[str, str]
) -> Iterator[Command]:
    """The commands of one (joined) shell line; ``NAME=value`` lines update ``variables``."""
    expanded = _expand(_substitute_commands(text), variables)
    try:
        words = _split_words(expanded)
    except ValueError as error:  # an unclosed quote
        raise CommandError(f"{source}:{line}: cannot split {text!r}: {error}") from error
    command: list[str] = []
    for word in [*words, ";"]:
        if word not in SEPARATORS:
            command.append(word)
            continue
        if command and command[0] == "export":
            command = command[1:]
        if command and all(ASSIGNMENT.match(w) for w in command):  # NAME=value: a variable
            for assignment in command:
                name, value = assignment.split("=", 1)
                variables[name] = value
        elif command:
            yield Command(source, line, tuple(command), text.strip())
        command = []


def _join_continuations(lines: list[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    pending: list[str] = []
    first = 0
    for number, text in lines:
        if not pending:
            first = number
        if text.rstrip().endswith("\\"):
            pending.append(text.rstrip()[:-1])
            continue
        pending.append(text)
        yield first, " ".join(part.strip() for part in pending)
        pending = []
    if pending:
        yield first, " ".join(part.strip() for part in pending)


def commands_in(path: Path) -> list[Command]:
    """The commands written in one Markdown file, in order."""
    source = str(path.relative_to(ROOT))
    lines = path.read_text().splitlines()
    found: list[Command] = []
    prose: list[str] = []  # the file with its fenced blocks blanked, for the inline spans
    block: list[tuple[int, str]] | None = None
    lang, fence = "", ""
    for number, text in enumerate(lines, 1):
        match = FENCE.match(text)
        if block is None and match:
            block, lang, fence = [], match["lang"].lower(), match["fence"]
            prose.append("")
            continue
        if block is not None and text.strip().startswith(fence) and text.strip() == fence:
            if lang in SHELL_BLOCKS:
                variables: dict[str, str] = {}
                if lang == "console":
                    block = [(n, t.strip()[2:]) for n, t in block if t.strip().startswith("$ ")]
                for first, joined in _join_continuations(block):
                    found.extend(_commands_of_line(source, first, joined, variables))
            block = None
            prose.append("")
            continue
        if block is not None:
            block.append((number, text))
            prose.append("")
        else:
            prose.append(text)
    text = "\n".join(prose)
    for match in INLINE.finditer(text):
        span = " ".join(match[1].split())
        words = span.split()
        while words and ASSIGNMENT.match(words[0]):
            words.pop(0)
        if len(words) < 2 or words[0] not in {"python", "python3"}:
            continue
        if not (words[1].endswith(".py") or words[1] in {"-m", "-c"}):
            continue
        line = text.count("\n", 0, match.start()) + 1
        found.extend(_commands_of_line(source, line, span, {}))
    return sorted(found, key=lambda c: c.line)


def documented_commands() -> list[Command]:
    return [command for path in DOCS for command in commands_in(path)]


def _ids(commands: list[Command]) -> list[str]:
    seen: dict[str, int] = {}
    ids = []
    for command in commands:
        program = next((w for w in command.words if not ASSIGNMENT.match(w)), "?")
        if program in {"python", "python3"}:
            rest = [w for w in command.words if not ASSIGNMENT.match(w)][1:]
            program = " ".join(rest[:2]) if rest and rest[0] in {"-m", "-c"} else (rest or ["?"])[0]
        base = f"{command.where}:{program.split('/')[-1][:40]}"
        seen[base] = seen.get(base, 0) + 1
        ids.append(base if seen[base] == 1 else f"{base}#{seen[base]}")
    return ids


# --- the programs -----------------------------------------------------------------------------


HYDRA_DECORATOR = re.compile(
    r"@hydra\.main\([^)]*config_name=[\"'](\w+)[\"']"  # Hydra's own
    r"|@hydra_main\([\"'](\w+)[\"']\)"  # src.build.hydra_main, which wraps it
)


def hydra_apps() -> dict[str, str]:
    """Root scripts decorated with ``@hydra.main`` (or ``src.build.hydra_main``), by file name:
    their config names."""
    apps = {}
    for script in ROOT.glob("*.py"):
        match = HYDRA_DECORATOR.search(script.read_text())
        if match:
            apps[script.name] = match[1] or match[2]
    return apps


HYDRA_APPS = hydra_apps()


def _root_module(script: str) -> ModuleType:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(Path(script).stem)


def _group_options(group: str) -> list[str]:
    folder = CONF / group
    return sorted(str(p.relative_to(folder).with_suffix("")) for p in folder.rglob("*.yaml"))


def _sweep_values(override: Override) -> list[str]:
    if override.value_type is not None and override.value_type.name == "GLOB_CHOICE_SWEEP":
        values = override.value().filter(_group_options(override.key_or_group))
        if not values:
            raise CommandError(f"{override.input_line}: the glob matches no option")
        return list(values)
    return list(override.sweep_string_iterator())


def _hydra_runs(overrides: list[str], multirun: bool) -> list[list[str]]:
    """The override lists a command composes: one, or under ``-m`` one per sweep value."""
    if not multirun:
        return [overrides]
    parsed = OverridesParser.create().parse_overrides(overrides)
    sweeps = {i: _sweep_values(o) for i, o in enumerate(parsed) if o.is_sweep_override()}
    if not sweeps:
        return [overrides]

    def run(choice: dict[int, str]) -> list[str]:
        return [
            f"{o.get_key_element()}={choice.get(i, sweeps[i][0])}" if i in sweeps else overrides[i]
            for i, o in enumerate(parsed)
        ]

    return [run({i: value}) for i, values in sweeps.items() for value in values]


def compose_app(config_name: str, overrides: list[str], *, check: bool = True) -> None:
    """Compose ``conf/<config_name>.yaml`` with ``overrides``, then (``check``) the config check
    every command runs."""
    from src.build import check_config

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
            if check:
                HydraConfig.instance().set_config(cfg)
                # as on the machine the command is written for: trainer=gpu has a GPU there
                with mock.patch.object(CUDAAccelerator, "is_available", return_value=True):
                    check_config(cfg, config_name)
    finally:
        GlobalHydra.instance().clear()


def _messages(error: BaseException) -> str:
    """An error's message and those of its causes, innermost last (Hydra wraps OmegaConf's)."""
    lines = []
    while error is not None:
        lines.append(f"{type(error).__name__}: {error}")
        error = error.__cause__
    return "\n".join(lines)


def run_hydra_app(script: str, arguments: list[str]) -> None:
    module = _root_module(script)
    if hasattr(module, "split_arguments"):  # translate.py: sentences are not overrides
        arguments, _ = module.split_arguments(arguments)
    config_name, overrides, multirun = HYDRA_APPS[script], [], False
    words = iter(arguments)
    for word in words:
        if word in {"-m", "--multirun"}:
            multirun = True
        elif word in {"-cn", "--config-name"}:
            config_name = next(words)
        elif word in HYDRA_FLAGS_WITH_VALUE:
            next(words, None)
        elif word in HYDRA_FLAGS or word.startswith(("--cfg=", "--package=", "--info=")):
            continue
        else:
            overrides.append(word)
    for run in _hydra_runs(overrides, multirun):
        try:
            compose_app(config_name, run)
        except COMPOSE_ERRORS as error:
            raise CommandError(f"{script} {' '.join(run)}\n{_messages(error)}") from None


class _Parsed(Exception):
    """Raised once a script's argparse parser has parsed its command line."""

    def __init__(self, namespace: argparse.Namespace) -> None:
        super().__init__("parsed")
        self.namespace = namespace


@contextlib.contextmanager
def _stop_after_parsing() -> Iterator[None]:
    """``ArgumentParser.parse_args`` / ``parse_known_args`` parse as usual, then raise
    :class:`_Parsed` instead of returning to the script (nested calls of subparsers return)."""
    original_args = argparse.ArgumentParser.parse_args
    original_known = argparse.ArgumentParser.parse_known_args
    depth = 0

    def wrap(original: Callable) -> Callable:
        def parse(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> object:
            nonlocal depth
            depth += 1
            try:
                result = original(self, *args, **kwargs)
            finally:
                depth -= 1
            if depth == 0:
                raise _Parsed(result[0] if isinstance(result, tuple) else result)
            return result

        return parse

    argparse.ArgumentParser.parse_args = wrap(original_args)
    argparse.ArgumentParser.parse_known_args = wrap(original_known)
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original_args
        argparse.ArgumentParser.parse_known_args = original_known


def parse_arguments(
    program: str, arguments: list[str], *, module: bool
) -> argparse.Namespace | None:
    """Run a script or module until its parser has parsed ``arguments``; None after ``--help``."""
    saved_argv, saved_path, saved_environ = sys.argv[:], sys.path[:], dict(os.environ)
    stderr, stdout = io.StringIO(), io.StringIO()
    sys.argv = [program, *arguments]
    try:
        with (
            _stop_after_parsing(),
            contextlib.redirect_stderr(stderr),
            contextlib.redirect_stdout(stdout),
            warnings.catch_warnings(),
        ):
            # a module of this package is already imported (the tests import it): run it anyway
            warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)
            if module:
                runpy.run_module(program, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(str(ROOT / program), run_name="__main__")
    except _Parsed as parsed:
        return parsed.namespace
    except SystemExit as exit_:
        if exit_.code in (0, None):
            return None
        raise CommandError(
            f"{program} {' '.join(arguments)}\n{stderr.getvalue().strip()}"
        ) from None
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        os.environ.clear()
        os.environ.update(saved_environ)
    raise CommandError(
        f"{program} returned without parsing its arguments with argparse: no rule runs it cheaply"
    )


def run_python(words: list[str]) -> None:
    if not words:
        raise CommandError("python without a script")
    if words[0] in {"-c", "-m"} and len(words) < 2:
        raise CommandError(f"python {words[0]} without its argument")
    if words[0] == "-c":
        compile(words[1], "<python -c>", "exec")
        return
    if words[0] == "-m":
        name, arguments = words[1], words[2:]
        namespace = parse_arguments(name, arguments, module=True)
        if name == "src.datamodules.check" and namespace is not None:
            try:
                compose_app("train", list(namespace.overrides), check=False)
            except COMPOSE_ERRORS as error:
                raise CommandError(f"{name} {' '.join(arguments)}\n{_messages(error)}") from None
        return
    script, arguments = words[0], words[1:]
    if not (ROOT / script).is_file():
        raise CommandError(f"{script} does not exist")
    if script in HYDRA_APPS:
        run_hydra_app(script, arguments)
        return
    namespace = parse_arguments(script, arguments, module=False)
    if script == "study.py" and namespace is not None:
        unknown = sorted(set(namespace.claims) - set(_group_options("study")))
        if unknown:
            raise CommandError(
                f"study.py: no claim {unknown} in conf/study/ ({_group_options('study')})"
            )


def _toml_table_keys(text: str, table: str) -> set[str]:
    """The keys of a TOML table (``[table]`` up to the next header); tomllib is Python 3.11+."""
    match = re.search(rf"^\[{re.escape(table)}\]\n(.*?)(?=^\[|\Z)", text, re.MULTILINE | re.DOTALL)
    return set(re.findall(r"^([\w-]+)\s*=", match[1], re.MULTILINE)) if match else set()


def _toml_list(path: Path, key: str) -> str:
    """The text of a TOML list value ``key = [...]``."""
    match = re.search(
        rf"^{re.escape(key)}\s*=\s*\[(.*?)^\]", path.read_text(), re.MULTILINE | re.DOTALL
    )
    return match[1] if match else ""


def check_pip(words: list[str]) -> None:
    if words[:1] != ["install"]:
        raise CommandError(f"pip {' '.join(words)}: only pip install has a rule")
    for word in words[1:]:
        if word.startswith("-"):
            continue
        match = re.fullmatch(
            r"(?P<path>\.{1,2}(?:/[^\[]*)?|/[^\[]*)(?:\[(?P<extras>[\w,-]+)\])?", word
        )
        if match is None:  # a package name from an index
            continue
        pyproject = ROOT / match["path"] / "pyproject.toml"
        if not pyproject.is_file():
            raise CommandError(f"pip install {word}: {pyproject} does not exist")
        declared = _toml_table_keys(pyproject.read_text(), "project.optional-dependencies")
        for extra in filter(None, (match["extras"] or "").split(",")):
            if extra not in declared:
                raise CommandError(
                    f"pip install {word}: no extra {extra!r} in pyproject.toml ({sorted(declared)})"
                )


def check_wandb(words: list[str]) -> None:
    if words[:1] != ["sweep"]:
        return  # agent, sync, login: a W&B server
    files = [w for w in words[1:] if not w.startswith("-")]
    if not files:
        raise CommandError("wandb sweep without a file")
    path = ROOT / files[-1]
    if not path.is_file():
        raise CommandError(f"wandb sweep {files[-1]}: no such file")
    sweep = yaml.safe_load(path.read_text())
    if (
        not isinstance(sweep, dict)
        or "parameters" not in sweep
        or not ({"program", "command"} & set(sweep))
    ):
        raise CommandError(f"{files[-1]} is not a W&B sweep (program or command, and parameters)")


def check_pytest(words: list[str]) -> None:
    declared = set(
        re.findall(r'^\s*"(\w+):', _toml_list(ROOT / "pyproject.toml", "markers"), re.MULTILINE)
    )
    arguments = iter(words)
    for word in arguments:
        if word == "-m":
            expression = next(arguments, "")
            unknown = set(re.findall(r"[A-Za-z_]\w*", expression)) - {"not", "and", "or"} - declared
            if unknown:
                raise CommandError(
                    f"pytest -m {expression!r}: undeclared markers {sorted(unknown)}"
                )
        elif word in {"-n", "-k", "-p", "--maxfail", "--durations", "-c", "--rootdir"}:
            next(arguments, None)
        elif not word.startswith("-") and not (ROOT / word.split("::")[0]).exists():
            raise CommandError(f"pytest {word}: no such test path")


def check_ruff(words: list[str]) -> None:
    if not words or words[0] != "check":
        raise CommandError(f"ruff {' '.join(words)}: only ruff check has a rule")
    if "[tool.ruff.lint]" not in (ROOT / "pyproject.toml").read_text():
        raise CommandError("ruff check: pyproject.toml selects no lint rules ([tool.ruff.lint])")
    for word in words[1:]:
        if not word.startswith("-") and not (ROOT / word).exists():
            raise CommandError(f"ruff check {word}: no such path")


def check_file(program: str, words: list[str]) -> None:
    files = [w for w in words if not w.startswith("-")]
    if not files or not (ROOT / files[0]).exists():
        raise CommandError(f"{program} {' '.join(words)}: the file it names does not exist")


def run_command(command: Command) -> str | None:
    """Check one command; the reason when a rule skips it."""
    words = list(command.words)
    bad = [w for w in words if w in REDIRECTIONS]
    if bad:
        raise CommandError(
            f"{command.where}: {command.text!r} has {bad[0]!r}, which the shell takes for a "
            "redirection; write a placeholder as $NAME or /path/to/..."
        )
    while words and ASSIGNMENT.match(words[0]):  # environment settings for the command
        words.pop(0)
    words = [w for w in words if w != "..."]
    if not words:
        raise CommandError(f"{command.where}: {command.text!r} names no program")
    program, arguments = words[0], words[1:]
    if program in SKIPPED_PROGRAMS:
        return SKIPPED_PROGRAMS[program]
    if program in {"python", "python3"}:
        run_python(arguments)
    elif program in {"pip", "pip3"}:
        check_pip(arguments)
    elif program == "wandb":
        check_wandb(arguments)
    elif program == "pytest":
        check_pytest(arguments)
    elif program == "ruff":
        check_ruff(arguments)
    elif program in {"bash", "sh", "sbatch", "source", ".", "cd"}:
        check_file(program, arguments)
    else:
        raise CommandError(
            f"{command.where}: no rule checks {program!r} commands ({command.text!r})"
        )
    return None


# --- the tests --------------------------------------------------------------------------------

COMMANDS = documented_commands()


@pytest.mark.parametrize("command", COMMANDS, ids=_ids(COMMANDS))
def test_documented_command(command: Command) -> None:
    failure = None
    try:
        skipped = run_command(command)
    except CommandError as error:
        failure = f"{command.where}: {command.text}\n{error}"
    if failure:
        pytest.fail(failure, pytrace=False)
    if skipped:
        pytest.skip(skipped)


def test_commands_are_found() -> None:
    """Both README commands are read, and every Hydra app and page has commands to check."""
    readme = [c.text for c in COMMANDS if c.source == "README.md"]
    assert 'pip install -e ".[dev]" && python train.py' in readme
    assert 'pip install -e ".[dev]" && ruff check && pytest -n auto' in readme
    assert {
        "train.py",
        "eval.py",
        "predict.py",
        "generate.py",
        "translate.py",
        "complexity.py",
    } <= set(HYDRA_APPS)
    without = [
        str(p.relative_to(ROOT)) for p in DOCS if not commands_in(p) and p.name != "config.md"
    ]
    assert not without, f"pages without a single checked command: {without}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("python train.py trainer.max_epochz=3", "max_epochz"),  # a misspelt key
        ("python train.py model=dicenet data=enwik8", "does not fit"),  # the entry point's check
        (
            "python train.py -m task.optimizer.lr=0.1,0.2 model=dicnet",
            "dicnet",
        ),  # an unknown option
        ("python train.py task.optimizer.lr=0.1,0.2", "multirun"),  # a sweep without -m
        ("python eval.py ckpt_path=<best>", "redirection"),  # a placeholder the shell misreads
        ("python study.py no_such_claim", "no_such_claim"),
        ("python benchmarks/ops.py --no-such-flag", "unrecognized arguments"),
        ("python -m src.datamodules.check data=imagenett", "imagenett"),
        ("wandb sweep sweeps/no_such_sweep.yaml", "no such file"),
        ("pytest -m 'not slwo' tests/ops", "slwo"),
    ],
)
def test_broken_commands_fail(text: str, message: str) -> None:
    """The checks find real errors: each of these broken commands fails, naming the error."""
    (command,) = list(_commands_of_line("example.md", 1, text, {}))
    with pytest.raises(CommandError, match=re.escape(message)):
        run_command(command)


# --- the paths the pages name -----------------------------------------------------------------

PATH_SPAN = re.compile(r"`((?:src|tests|benchmarks|conf|sweeps|docs|\.ci)/[^`\s]*)`")


def _expand_braces(path: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", path)
    if match is None:
        return [path]
    return [
        expanded
        for option in match[1].split(",")
        for expanded in _expand_braces(path[: match.start()] + option + path[match.end() :])
    ]


def missing_paths(path: Path) -> list[str]:
    """The repository paths a page names in code spans that do not exist (``<...>`` placeholders
    and ``*`` globs read as patterns; ``{a,b}`` as both)."""
    missing = []
    for match in PATH_SPAN.finditer(path.read_text()):
        written = match[1].rstrip(".,:;)").split("::")[0]
        written = re.split(r"(?<=\.py)\.", written)[0]  # src/models/x.py.Class -> the file
        for candidate in _expand_braces(written):
            if "<" in candidate:
                continue
            if "*" in candidate:
                found = list(ROOT.glob(candidate))
            else:
                found = [ROOT / candidate] if (ROOT / candidate).exists() else []
                parent, _, last = candidate.rpartition("/")
                if not found and "." in last:  # src/models/module.Class: the module
                    module = ROOT / parent / f"{last.split('.')[0]}.py"
                    found = [module] if module.is_file() else []
            if not found:
                missing.append(candidate)
    return sorted(set(missing))


@pytest.mark.parametrize("page", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_documented_paths_exist(page: Path) -> None:
    """Every file or folder of the repository a page names in code exists (after a move, the page
    must follow)."""
    missing = missing_paths(page)
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_readme_layout_lists_the_tree() -> None:
    """The README's layout names every root script, every ``src/`` package and every config
    group."""
    text = (ROOT / "README.md").read_text()
    layout = text[text.index("## Layout") :]
    expected = [p.name for p in ROOT.glob("*.py")]
    expected += [
        f"src/{p.name}/" for p in (ROOT / "src").iterdir() if (p / "__init__.py").is_file()
    ]
    expected += [f"  {p.name}/" for p in CONF.iterdir() if p.is_dir()]
    missing = [name for name in expected if name not in layout]
    assert not missing, f"README.md's layout lacks {missing}"


LINK = re.compile(r"\[[^\]]*\]\((?!https?://|mailto:)([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    anchors = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            heading = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", heading).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("page", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_links_resolve(page: Path) -> None:
    """Every relative link of a page reaches a file, and its #anchor a heading there."""
    broken = []
    for target in LINK.findall(page.read_text()):
        file, _, anchor = target.partition("#")
        linked = (page.parent / file).resolve() if file else page
        if not linked.exists() or (
            anchor and linked.suffix == ".md" and anchor not in _anchors(linked)
        ):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: broken links {broken}"
