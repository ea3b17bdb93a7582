"""Unpack an uploaded checkpoint (zip, tar[.gz] or .gguf) into a directory, refusing anything unsafe.

Every member is checked before a byte is written: no absolute paths, no ``..``, no links or
device files, nothing that would land outside the target directory, no pickle checkpoints
(unpickling runs code). Sizes are counted as bytes are written, so an archive that lies about
its members' sizes still stops at the limit.
"""

from __future__ import annotations

import shutil
import stat
import tarfile
import zipfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from django.conf import settings
from django.core.exceptions import ValidationError

DEFAULT_MAX_UPLOAD_BYTES = 20 << 30  # 20 GiB
DEFAULT_MAX_UPLOAD_MEMBERS = 10_000
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle")
ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz")
COPY_CHUNK = 1 << 20
GGUF_MAGIC = b"GGUF"


def max_upload_bytes() -> int:
    return int(getattr(settings, "PAGODA_MAX_UPLOAD_BYTES", DEFAULT_MAX_UPLOAD_BYTES))


def max_upload_members() -> int:
    return int(getattr(settings, "PAGODA_MAX_UPLOAD_MEMBERS", DEFAULT_MAX_UPLOAD_MEMBERS))


def refuse(message: str, code: str) -> ValidationError:
    return ValidationError(message, code=code)


class ByteBudget:
    """Bytes written so far against PAGODA_MAX_UPLOAD_BYTES."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0

    def copy(self, source: BinaryIO, target: Path) -> None:
        with target.open("xb") as out:
            while chunk := source.read(COPY_CHUNK):
                self.used += len(chunk)
                if self.used > self.limit:
                    raise refuse(f"the upload unpacks to more than {self.limit} bytes "
                                 f"(PAGODA_MAX_UPLOAD_BYTES)", "upload_too_large")
                out.write(chunk)


def safe_member_path(root: Path, name: str) -> Path:
    """Where member ``name`` goes under ``root``; ValidationError if it would escape it."""
    pure = PurePosixPath(name.replace("\\", "/"))
    if pure.is_absolute() or (pure.parts and pure.parts[0].endswith(":")):
        raise refuse(f"archive member {name!r} has an absolute path", "unsafe_archive")
    if ".." in pure.parts:
        raise refuse(f"archive member {name!r} climbs out of the archive with '..'", "unsafe_archive")
    if pure.suffix.lower() in PICKLE_SUFFIXES:
        raise refuse(f"archive member {name!r} is a pickle checkpoint, which can run code when "
                     f"loaded; upload safetensors or GGUF weights instead", "pickle_checkpoint")
    target = (root / pure).resolve()
    if target != root.resolve() and root.resolve() not in target.parents:
        raise refuse(f"archive member {name!r} would be written outside the model directory",
                     "unsafe_archive")
    return target


def _check_count(count: int) -> None:
    if count > max_upload_members():
        raise refuse(f"the archive has {count} members, more than {max_upload_members()} "
                     f"(PAGODA_MAX_UPLOAD_MEMBERS)", "too_many_members")


def extract_zip(archive: Path, root: Path, budget: ByteBudget) -> None:
    with zipfile.ZipFile(archive) as zf:
        members = zf.infolist()
        _check_count(len(members))
        plan = []
        for info in members:
            target = safe_member_path(root, info.filename)
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise refuse(f"archive member {info.filename!r} is a symbolic link", "unsafe_archive")
            plan.append((info, target))
        for info, target in plan:
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as source:
                budget.copy(source, target)


def extract_tar(archive: Path, root: Path, budget: ByteBudget) -> None:
    with tarfile.open(archive, mode="r:*") as tf:
        members = tf.getmembers()
        _check_count(len(members))
        for member in members:
            safe_member_path(root, member.name)
            if member.issym() or member.islnk():
                raise refuse(f"archive member {member.name!r} is a link (to {member.linkname!r})",
                             "unsafe_archive")
            if not (member.isfile() or member.isdir()):
                raise refuse(f"archive member {member.name!r} is not a regular file or directory",
                             "unsafe_archive")
        for member in members:
            target = safe_member_path(root, member.name)
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tf.extractfile(member)
            budget.copy(source, target)


def _is_archive(name: str) -> bool:
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def store_upload(chunks: Iterable[bytes], target: Path, budget: ByteBudget) -> None:
    """Write the uploaded bytes to ``target``, counting them against the budget."""
    with target.open("xb") as out:
        for chunk in chunks:
            budget.used += len(chunk)
            if budget.used > budget.limit:
                raise refuse(f"the upload is larger than {budget.limit} bytes "
                             f"(PAGODA_MAX_UPLOAD_BYTES)", "upload_too_large")
            out.write(chunk)


def unpack_upload(uploaded_file, staging: Path) -> Path:
    """Unpack ``uploaded_file`` (a Django File) under ``staging``; returns the checkpoint path in it.

    The result is a directory with config.json (a single top-level folder is flattened away) or
    a .gguf file. ValidationError says why an upload was refused; ``staging`` is left for the
    caller to remove.
    """
    name = Path(uploaded_file.name or "").name
    lower = name.lower()
    if lower.endswith(PICKLE_SUFFIXES):
        raise refuse(f"{name!r} is a pickle checkpoint, which can run code when loaded; upload "
                     f"safetensors or GGUF weights instead", "pickle_checkpoint")
    if not (lower.endswith(".gguf") or _is_archive(lower)):
        raise refuse(f"{name!r} is neither a .gguf file nor a .zip/.tar.gz archive of a Hugging "
                     f"Face directory", "unsupported_upload")
    staging.mkdir(parents=True, exist_ok=True)
    upload_budget = ByteBudget(max_upload_bytes())
    if lower.endswith(".gguf"):
        target = staging / name
        store_upload(uploaded_file.chunks(), target, upload_budget)
        with target.open("rb") as handle:
            if handle.read(4) != GGUF_MAGIC:
                raise refuse(f"{name!r} does not start with the GGUF magic bytes", "invalid_gguf")
        return target
    archive = staging / ("upload" + "".join(Path(lower).suffixes[-2:]))
    store_upload(uploaded_file.chunks(), archive, upload_budget)
    root = staging / "checkpoint"
    root.mkdir()
    try:
        if lower.endswith(".zip"):
            extract_zip(archive, root, ByteBudget(max_upload_bytes()))
        else:
            extract_tar(archive, root, ByteBudget(max_upload_bytes()))
    except (zipfile.BadZipFile, tarfile.TarError, EOFError) as exc:
        raise refuse(f"{name!r} is not a readable archive: {exc}", "invalid_archive") from exc
    finally:
        archive.unlink(missing_ok=True)
    entries = list(root.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and not (root / "config.json").exists():
        root = entries[0]
    if not (root / "config.json").is_file():
        raise refuse(f"{name!r} has no config.json at its top level (nor in a single top-level "
                     f"folder)", "not_a_checkpoint")
    if not any(root.glob("*.safetensors")):
        raise refuse(f"{name!r} contains no *.safetensors weights", "not_a_checkpoint")
    return root


def move_into_place(checkpoint: Path, destination: Path) -> Path:
    """Move the unpacked checkpoint to ``destination`` (a directory); returns its final path."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    # v<n> is numbered past every version row, so anything there is left from a rolled-back upload.
    shutil.rmtree(destination, ignore_errors=True)
    if checkpoint.is_file():
        destination.mkdir()
        return Path(shutil.move(str(checkpoint), str(destination / checkpoint.name)))
    return Path(shutil.move(str(checkpoint), str(destination)))
