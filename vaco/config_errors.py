"""One-line configuration errors: the field, what is wrong, and a did-you-mean.

jsonargparse reports a bad ``--data.init_args.num_envz`` as a screenful of usage text followed by
a nested union report (``Parser key "data": Does not validate against any of the Union
subtypes ... Problem with given class_path ... Option 'num_envz' is not accepted``). This module
turns such a report into ``data.init_args.num_envz: vaco.data.RolloutDataModule has no field
'num_envz'. Did you mean num_envs?``. Imports nothing heavy: ``vaco --help`` uses it.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
from pathlib import Path

from vaco.files import YAMLTooLarge, load_yaml

__all__ = [
    "ConfigurationError",
    "check_command_line_values",
    "one_line",
    "did_you_mean",
    "summarize_validation_error",
]


class ConfigurationError(ValueError):
    """A config value or combination was rejected (the message names the field)."""


_BOOKKEEPING = (
    "Does not validate against any of the Union subtypes",
    "Subtypes:",
    "Errors:",
    "Given value type:",
    "Given value:",
    "Expected a <class 'NoneType'>",
    "- Expected a <class 'NoneType'>",
)


def did_you_mean(word: str, candidates) -> str:
    close = difflib.get_close_matches(word, list(candidates), n=2, cutoff=0.6)
    return f" Did you mean {' or '.join(close)}?" if close else ""


def _init_params(class_path: str) -> list[str]:
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
        params = inspect.signature(cls.__init__).parameters
    except Exception:  # noqa: BLE001 - a suggestion is optional
        return []
    return [
        p
        for p in params
        if p != "self" and params[p].kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    ]


def summarize_validation_error(message: str) -> str:
    """A jsonargparse (nested union) validation report as one line naming the field."""
    path: list[str] = []
    classes: list[str] = []
    reasons: list[str] = []
    for raw in message.splitlines():
        line = raw.strip()
        if not line or any(line.startswith(b) for b in _BOOKKEEPING):
            continue
        line = line[2:] if line.startswith("- ") else line
        key = re.fullmatch(r'Parser key "([^"]+)":?(.*)', line)
        if key:
            path.append(key.group(1))
            if key.group(2).strip():
                reasons.append(key.group(2).strip())
            continue
        cls = re.fullmatch(r"Problem with given class_path '([^']+)':?(.*)", line)
        if cls:
            classes.append(cls.group(1))
            if key is None and (not path or path[-1] != "init_args"):
                path.append("init_args")
            if cls.group(2).strip():
                reasons.append(cls.group(2).strip())
            continue
        option = re.fullmatch(r"Option '([^']+)' is not accepted", line)
        if option and classes:
            name = option.group(1)
            path.append(name)
            hint = did_you_mean(name, _init_params(classes[-1]))
            reasons.append(f"{classes[-1]} has no field {name!r}.{hint}")
            continue
        reasons.append(line)
    unimportable = bool(classes) and any("has no attribute" in r or "No module named" in r for r in reasons)
    if unimportable:
        # a class_path was given and its class could not be imported: the union's other members
        # (`trainer.logger` may also be a bool or a list) are not what the user meant
        reasons = [r for r in reasons if not r.startswith("Expected a <class")]
    if path and path[-1] == "init_args" and unimportable:
        path.pop()  # the class itself could not be imported: name the class_path field
    field = ".".join(path)
    text = "; ".join(dict.fromkeys(reasons)) or message.strip().splitlines()[0]
    text = _NOT_ACCESSIBLE.sub("", text)
    text += shipped_choices(text, classes[-1] if classes else None)
    return f"`{field}`: {text}" if field else text


def one_line(message: str, known_options=()) -> str:
    """Any jsonargparse parse error as one line."""
    unknown = re.match(r"unrecognized arguments: (\S+)", message.strip())
    if unknown:
        option = unknown.group(1).split("=")[0]
        return f"unknown option {option}.{did_you_mean(option, known_options)}"
    if "Parser key" in message or "class_path" in message:
        return summarize_validation_error(message)
    return " ".join(line.strip() for line in message.strip().splitlines() if line.strip())


# ---------------------------------------------------------------------------------------- config files
def config_files(argv: list[str]) -> list[str]:
    """The files given as ``--config FILE`` or ``--config=FILE``, in order."""
    out = []
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif arg.startswith("--config="):
            out.append(arg.split("=", 1)[1])
    return out


def check_config_files(paths: list[str]) -> dict[str, object]:
    """Read each ``--config`` file before the parser does, so a missing or unreadable file, a tab,
    or broken indentation is one line naming the file, the line and what is wrong (jsonargparse
    says ``"<unicode string>", line 4``), and so is an alias bomb (:func:`vaco.files.load_yaml`).
    Returns file -> its parsed content."""
    import yaml

    loaded = {}
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            raise ConfigurationError(f"`--config {path}`: no such file") from None
        except IsADirectoryError:
            raise ConfigurationError(f"`--config {path}`: a directory, not a YAML file") from None
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigurationError(
                f"`--config {path}`: cannot be read ({getattr(err, 'strerror', None) or err})"
            ) from None
        try:
            loaded[path] = load_yaml(text)
        except YAMLTooLarge as err:
            raise ConfigurationError(f"`--config {path}`: {err}") from None
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            line = mark.line + 1 if mark is not None else None
            where = f"line {line}, column {mark.column + 1}" if mark is not None else "somewhere"
            bad_line = text.splitlines()[line - 1] if line and line <= len(text.splitlines()) else ""
            if "\t" in bad_line[: len(bad_line) - len(bad_line.lstrip())] or (mark is not None and "\t" in bad_line):
                what = "a tab character: YAML indents with spaces only"
            else:
                what = getattr(err, "problem", None) or str(err).splitlines()[0]
                if any(p in what for p in ("block end", "block mapping", "mapping values are not allowed")):
                    what = f"the indentation does not line up with the lines above (YAML nests by indentation; {what})"
                else:
                    context = getattr(err, "context", None)
                    what = f"{what} ({context})" if context else what
            raise ConfigurationError(f"`--config {path}`: {where}: {what}") from None
        if loaded[path] is not None and not isinstance(loaded[path], dict):
            raise ConfigurationError(
                f"`--config {path}`: a config file is a mapping of fields, got {type(loaded[path]).__name__}"
            )
    return loaded


def refuse_sweep_files(loaded: dict[str, object]) -> None:
    """A sweep file given to ``vaco fit --config`` is one line saying to run it with ``vaco sweep``."""
    for path, tree in loaded.items():
        if isinstance(tree, dict) and {"grid", "experiment"} & tree.keys() and "model" not in tree:
            kind = "grid" if "grid" in tree else "experiment"
            raise ConfigurationError(
                f"`--config {path}`: a sweep file (it has `{kind}`), not a run's config: run it with "
                f"`vaco sweep --config {path}`"
            )


def check_command_line_values(argv: list[str]) -> None:
    """A value given on the command line goes through the same alias guard as a file
    (:func:`vaco.files.load_yaml`): jsonargparse reads ``--field '{a: &a [...], b: [*a, *a]}'`` as
    YAML and would expand an alias bomb into gigabytes."""
    import yaml

    pairs = []
    for i, arg in enumerate(argv):
        if not arg.startswith("--") or arg.startswith("--config"):
            continue
        if "=" in arg:
            pairs.append(tuple(arg[2:].split("=", 1)))
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            pairs.append((arg[2:], argv[i + 1]))
    for key, value in pairs:
        if "&" not in value and "*" not in value:  # no anchor, no alias: nothing to expand
            continue
        try:
            load_yaml(value)
        except YAMLTooLarge as err:
            raise ConfigurationError(f"`{key}` (given on the command line): {err}") from None
        except yaml.YAMLError:
            pass  # not YAML the guard can read: the parser reports it


def _flat_keys(tree, prefix: str = "") -> set[str]:
    keys = set()
    if isinstance(tree, dict):
        for key, value in tree.items():
            full = f"{prefix}{key}"
            keys.add(full)
            keys |= _flat_keys(value, full + ".")
    return keys


def given_on_command_line(message: str, argv: list[str]) -> bool:
    """Whether the field a one-line error names (```a.b.c`: ...``) was set on the command line (in
    its long or ``init_args``-less spelling, or through one of its sub-fields such as
    ``--a.b.c.class_path``): then the value is the command line's, not a file's."""
    found = re.match(r"`([^`]+)`", message)
    if not found:
        return False
    short = found.group(1).replace(".init_args.", ".")
    for word in argv:
        if word.startswith("--"):
            key = word[2:].split("=", 1)[0].replace(".init_args.", ".")
            if key == short or key.startswith(short + "."):
                return True
    return False


#: jsonargparse's preamble to an import failure, which the reason after it already says
_NOT_ACCESSIBLE = re.compile(r"Expected a path but \S+ either not accessible or invalid; ")
_NO_ATTRIBUTE = re.compile(r"module '(vaco(?:\.\w+)*)' has no attribute '(\w+)'")


def defined_in(name: str) -> list[str]:
    """The vaco modules whose source defines a class ``name`` (read as text: nothing is imported)."""
    root = Path(__file__).resolve().parent
    pattern = re.compile(rf"^class {re.escape(name)}\b", re.MULTILINE)
    found = []
    for path in sorted(root.rglob("*.py")):
        if pattern.search(path.read_text(encoding="utf-8")):
            parts = path.relative_to(root.parent).with_suffix("").parts
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def shipped_choices(message: str, class_path: str | None = None) -> str:
    """For a class path into a vaco module that has no such class, the classes it ships and a
    did-you-mean (``vaco.objectives.PPO``: PPOClip, PPOKL, ...); for a vaco class named under a
    module that does not hold it (``vaco.logger.VacoMLFlowLogger``), the module that does; else ``""``."""
    found = _NO_ATTRIBUTE.search(message)
    if not found:
        return ""
    module_name, wanted = found.groups()
    name = (class_path or "").rpartition(".")[2]
    homes = [f"{home}.{name}" for home in defined_in(name)] if class_path and class_path.startswith("vaco.") else []
    if homes and class_path not in homes:
        return f". Did you mean {' or '.join(homes)}?"
    try:
        module = importlib.import_module(module_name)
    except Exception:  # noqa: BLE001 - a suggestion is optional
        return ""
    names = [
        n
        for n in getattr(module, "__all__", ())
        if inspect.isclass(getattr(module, n, None)) and not getattr(module, n).__module__.endswith(".base")
    ]
    if not names:
        return ""
    close = difflib.get_close_matches(wanted, names, n=2, cutoff=0.6)
    hint = f" Did you mean {' or '.join(f'{module_name}.{c}' for c in close)}?" if close else ""
    return f".{hint} {module_name} ships {', '.join(names)}."


def file_of_key(message: str, loaded: dict[str, object]) -> str | None:
    """The ``--config`` file that holds the field a one-line error names (```a.b.c`: ...``)."""
    found = re.match(r"`([^`]+)`", message)
    if not found:
        return None
    key = found.group(1)
    short = key.replace(".init_args.", ".")
    for path, tree in reversed(list(loaded.items())):  # the last file wins, as in the parser
        keys = _flat_keys(tree)
        if key in keys or short in {k.replace(".init_args.", ".") for k in keys}:
            return path
    return None
