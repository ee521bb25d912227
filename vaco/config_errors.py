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

__all__ = ["ConfigurationError", "one_line", "did_you_mean", "summarize_validation_error"]


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
    return [p for p in params if p != "self" and params[p].kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)]


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
    if path and path[-1] == "init_args" and classes and reasons and "has no attribute" in " ".join(reasons):
        path.pop()  # the class itself could not be imported: name the class_path field
    field = ".".join(path)
    text = "; ".join(dict.fromkeys(reasons)) or message.strip().splitlines()[0]
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
