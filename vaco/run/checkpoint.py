"""Checkpoints: what they may hold, how vaco reads them (never running code), how it writes them.

A vaco checkpoint is a ``torch.save`` zip archive of nested dicts and lists of **tensors and plain
values** (str, int, float, bool, None): the networks' weights, optimiser and scheduler state,
RNG states, the collector's env snapshots and counters, hyperparameters. Nothing else is written,
so everything vaco reads goes through ``torch.load(weights_only=True)``, PyTorch's restricted
unpickler that cannot import a module or call a function. A file that needs more than that (a
pickled class, a ``__reduce__`` payload) is refused before any of it is used.

Writes are atomic: the archive goes to a temporary file beside the target, is flushed to disk,
and replaces the target in one ``os.replace``. A crash, a kill or a full disk during a write
leaves the previous ``last.ckpt`` whole.

:class:`SafeCheckpointIO` is Lightning's seam for both (a ``CheckpointIO`` plugin); vaco's
checkpoint callback installs it, so ``vaco fit --ckpt_path`` loads through it too.
"""

from __future__ import annotations

import glob
import json
import os
import pickle
import re
import tempfile
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from vaco.files import current_umask

__all__ = [
    "is_llm_checkpoint",
    "CheckpointError",
    "load_checkpoint",
    "save_atomic",
    "SafeCheckpointIO",
    "pack_state",
    "unpack_state",
]


class CheckpointError(ValueError):
    """A checkpoint could not be used: missing, empty, truncated, corrupted, or unsafe (the message says which)."""


def is_llm_checkpoint(ckpt: dict) -> bool:
    """Whether a loaded checkpoint was written by the LLM track's learner (``RLVRModule``): it
    records the model it fine-tunes. Read without the ``llm`` extra (no transformers needed)."""
    return "model_path" in ckpt.get("hyper_parameters", {})


def load_checkpoint(path: str | os.PathLike, *, field: str = "checkpoint", map_location: Any = "cpu") -> dict:
    """Read a checkpoint with PyTorch's restricted unpickler (``weights_only=True``).

    Args:
        path: the file.
        field: how the user named it (``--ckpt_path``, ``--ckpt``), for the error message.
        map_location: where tensors go (default: the CPU, so a GPU-trained file loads anywhere).

    Raises:
        CheckpointError: one line naming ``field`` and the file, saying what is wrong.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"`{field}`: no checkpoint at {path}")
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"`{field}`: {path} is empty (0 bytes): the write that made it never finished")
    if not zipfile.is_zipfile(path):
        if _is_text(path):  # a config or a log passed by mistake: "use an earlier checkpoint" would mislead
            raise CheckpointError(
                f"`{field}`: {path} is a text file (a config?), not a checkpoint: vaco writes checkpoints as "
                "checkpoints/<run id>/last.ckpt (the path `vaco fit` prints at its end)"
            )
        raise CheckpointError(
            f"`{field}`: {path} is truncated or not a checkpoint ({size} bytes, no zip end record): "
            "use an earlier checkpoint"
        )
    damaged = _damaged_member(path)
    if damaged is not None:
        raise CheckpointError(
            f"`{field}`: {path} is corrupted ({damaged} fails its CRC-32 check: its bytes changed after it was "
            "written): use an earlier checkpoint"
        )
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        text = str(err).split("WeightsUnpickler error:")[-1].strip()
        found = re.search(r"GLOBAL (\S+)", text)
        detail = f"it would import and call `{found.group(1)}`" if found else text.splitlines()[0][:200]
        raise CheckpointError(
            f"`{field}`: refused {path}: it holds something other than tensors and plain values "
            f"({detail}). Loading it could run code, and vaco never does; a checkpoint written by "
            "vaco holds only tensors and plain values"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"`{field}`: {path} is corrupted ({first}): use an earlier checkpoint") from None


def _damaged_member(path: Path) -> str | None:
    """The first member of the archive whose bytes do not match the CRC-32 the writer recorded
    (torch's own reader does not check it: overwritten tensor bytes would load as other numbers)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return f"the archive ({first})"


def _is_text(path: Path) -> bool:
    """Whether the file's first KiB is UTF-8 text without NUL bytes (a checkpoint never is)."""
    with open(path, "rb") as f:
        head = f.read(1024)
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\0" not in head


def save_atomic(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to a temporary file in the same directory, fsync, then ``os.replace``.

    The file gets the mode a plain ``open`` would give it (0666 less the umask): ``mkstemp``
    creates 0600, which would hide checkpoints on shared storage from collaborators' accounts."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = None
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb") as f:
            writer = _RecordingWriter(f)
            torch.save(obj, writer)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        if os.path.exists(tmp):
            os.remove(tmp)
        # torch's zip writer turns a failed write into "RuntimeError: [enforce fail at
        # inline_container.cc] unexpected pos ..."; the OSError it swallowed says what happened
        failure = writer.error if writer is not None and writer.error is not None else err
        if isinstance(failure, OSError):  # a full disk, a quota, a read-only mount: one line naming the file
            then = (
                "the previous checkpoint there is intact: free space (or choose `checkpoint.dirpath`) and resume "
                "from it with --ckpt_path"
                if path.exists()
                else "no checkpoint was written there before: free space (or choose `checkpoint.dirpath`) and start again"
            )
            raise CheckpointError(
                f"cannot write the checkpoint {path} ({failure.strerror or failure}); {then}"
            ) from None
        raise
    # a writer killed mid-write (SIGKILL at the end of a grace period) leaves its temporary file,
    # up to a whole checkpoint, as a dot-file nobody sees: the next write of that path removes them
    # (one process writes a run's checkpoints: vaco.run.lock)
    for stale in path.parent.glob(f".{glob.escape(path.name)}.*.partial"):
        try:
            stale.unlink()
        except OSError:
            pass
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


class _RecordingWriter:
    """The file object ``torch.save`` writes through, keeping the first ``OSError`` of a write."""

    def __init__(self, file) -> None:
        self.file, self.error = file, None

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as err:
            self.error = self.error or err
            raise

    def flush(self) -> None:
        self.file.flush()


class SafeCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint I/O with vaco's guarantees: atomic local writes, safe reads.

    Remote URLs (``s3://``, ...) are written by Lightning's own transactional writer.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        if storage_options is not None:
            raise TypeError(f"`storage_options` is not supported by {type(self).__name__}")
        save_atomic(checkpoint, path)

    def load_checkpoint(self, path, map_location: Any = "cpu", weights_only: bool | None = None) -> dict[str, Any]:
        if weights_only is False:
            raise CheckpointError("vaco loads checkpoints with weights_only=True only")
        return load_checkpoint(path, field="ckpt_path", map_location=map_location or "cpu")


# ---------------------------------------------------------------------------------------------
# Nested state as tensors. TorchRL's worker processes ship a collector's state through a
# TensorDict, which turns Python floats into float32 tensors and cannot hold 128-bit ints (numpy's
# PCG64 state) or None. ``pack_state`` keeps such a state exact without pickle: the structure and
# plain values go into one JSON document (floats round-trip exactly through ``repr``), stored as a
# uint8 tensor, and every tensor or array stays a tensor beside it.

_TENSOR = "__tensor__"


def pack_state(state: Any) -> OrderedDict:
    """Encode nested dicts (str keys) / lists / tuples of tensors, arrays and plain values as tensors."""
    tensors: list[torch.Tensor] = []

    def encode(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            tensors.append(x.detach().cpu().clone())
            return {_TENSOR: len(tensors) - 1}
        if isinstance(x, np.ndarray):
            tensors.append(torch.from_numpy(np.array(x, copy=True)))
            return {_TENSOR: len(tensors) - 1}
        if isinstance(x, np.generic):
            return x.item()
        if isinstance(x, dict):
            if not all(isinstance(k, str) for k in x):
                raise TypeError(f"pack_state: dict keys must be strings, got {list(x)[:3]}")
            if _TENSOR in x:
                raise ValueError(f"pack_state: {_TENSOR!r} is a reserved key")
            return {k: encode(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [encode(v) for v in x]
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        raise TypeError(f"pack_state: cannot store a {type(x).__name__} (tensors and plain values only)")

    document = json.dumps(encode(state)).encode()
    packed = OrderedDict(json=torch.frombuffer(bytearray(document), dtype=torch.uint8))
    packed.update((f"tensor_{i}", t) for i, t in enumerate(tensors))
    return packed


def unpack_state(packed: dict) -> Any:
    """Inverse of :func:`pack_state` (tensors come back as tensors, tuples as lists)."""
    if "json" not in packed:
        raise ValueError(
            f"not a packed state (keys {sorted(packed)[:4]}): an older vaco stored actor states as a pickle, "
            "which is never loaded; resume that run with the vaco version that wrote it, or start afresh"
        )
    document = bytes(torch.as_tensor(packed["json"], dtype=torch.uint8).numpy()).decode()

    def decode(x: Any) -> Any:
        if isinstance(x, dict):
            if set(x) == {_TENSOR}:
                return torch.as_tensor(packed[f"tensor_{x[_TENSOR]}"])
            return {k: decode(v) for k, v in x.items()}
        if isinstance(x, list):
            return [decode(v) for v in x]
        return x

    return decode(json.loads(document))


# Checkpoints hold only tensors and plain Python values, so Lightning (and torch.load) can read
# them with weights_only=True.
def numpy_rng_state() -> dict:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "keys": torch.from_numpy(keys.astype(np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached": float(cached),
    }


def set_numpy_rng_state(state: dict) -> None:
    keys = state["keys"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, state["pos"], state["has_gauss"], state["cached"]))
