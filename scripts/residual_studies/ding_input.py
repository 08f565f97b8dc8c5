"""Reading the Ding dictionary for :mod:`.ding_corpus`: its text from the Debian package ``trans-de-en`` (an
``ar`` archive whose ``data.tar.{xz,gz,bz2}`` member holds ``usr/share/trans/de-en``) or from the extracted
file, checked to be the ``DE | ... :: EN | ...`` dictionary. Standard library only.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import tarfile
from typing import Dict

from .runner import ToolError

#: Path of the dictionary file inside the Debian package.
DING_MEMBER = "usr/share/trans/de-en"
FIX_HINT = (
    "Fix: run `apt-get download trans-de-en` and pass the resulting "
    "trans-de-en_1.9-6_all.deb, or pass the file usr/share/trans/de-en "
    "extracted from it with `dpkg-deb -x trans-de-en_1.9-6_all.deb DIR`."
)


class CorpusInputError(ToolError):
    """The input file is missing or is not the expected Ding/.deb format."""


def _read_ar_members(data: bytes, path: str) -> Dict[str, bytes]:
    """Parse a Unix ``ar`` archive (the container format of a ``.deb``).

    Returns a mapping from member name to member bytes.
    """
    if not data.startswith(b"!<arch>\n"):
        raise CorpusInputError(f"{path}: not an ar/.deb archive. {FIX_HINT}")
    members: Dict[str, bytes] = {}
    pos = 8
    while pos + 60 <= len(data):
        header = data[pos:pos + 60]
        if header[58:60] != b"`\n":
            raise CorpusInputError(
                f"{path}: corrupt .deb (bad ar header at byte {pos}). {FIX_HINT}")
        name = header[0:16].decode("ascii", "replace").strip()
        if name.endswith("/"):  # GNU ar terminates names with '/'
            name = name[:-1]
        try:
            size = int(header[48:58].decode("ascii").strip())
        except ValueError:
            raise CorpusInputError(
                f"{path}: corrupt .deb (bad ar member size at byte {pos}). "
                f"{FIX_HINT}") from None
        start = pos + 60
        members[name] = data[start:start + size]
        pos = start + size + (size % 2)  # members are 2-byte aligned
    return members


def _decompress_data_tar(name: str, blob: bytes, path: str) -> bytes:
    """Decompress the ``data.tar.*`` member of a ``.deb``."""
    if name == "data.tar":
        return blob
    if name == "data.tar.xz":
        return lzma.decompress(blob)
    if name == "data.tar.gz":
        return gzip.decompress(blob)
    if name == "data.tar.bz2":
        return bz2.decompress(blob)
    raise CorpusInputError(
        f"{path}: {name} is not supported by the Python standard library. "
        f"Fix: extract it with `dpkg-deb -x {os.path.basename(path)} DIR` and "
        f"pass DIR/{DING_MEMBER} instead.")


def read_ding_deb(path: str) -> str:
    """Return the text of ``usr/share/trans/de-en`` from a ``.deb`` file."""
    with open(path, "rb") as f:
        data = f.read()
    members = _read_ar_members(data, path)
    data_names = [n for n in members if n.startswith("data.tar")]
    if not data_names:
        raise CorpusInputError(
            f"{path}: .deb has no data.tar member. {FIX_HINT}")
    tar_bytes = _decompress_data_tar(data_names[0], members[data_names[0]], path)
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.lstrip("./") == DING_MEMBER:
                fobj = tar.extractfile(member)
                assert fobj is not None
                raw = fobj.read()
                break
        else:
            raise CorpusInputError(
                f"{path}: .deb does not contain {DING_MEMBER}; is this the "
                f"trans-de-en package? {FIX_HINT}")
    return _decode(raw, f"{path}:{DING_MEMBER}")


def _decode(raw: bytes, label: str) -> str:
    """Decode UTF-8 bytes, raising :class:`CorpusInputError` on failure."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorpusInputError(
            f"{label}: not UTF-8 text ({exc}). Expected the Ding dictionary "
            f"file (lines 'DE | ... :: EN | ...'). {FIX_HINT}") from None


def validate_ding_text(text: str, label: str) -> None:
    """Check that *text* looks like the Ding ``de-en`` file.

    At least one non-comment line is required and at least 90 % of the
    non-empty, non-comment lines must contain exactly one ``' :: '``.
    """
    body = [ln for ln in text.splitlines()
            if ln.strip() and not ln.startswith("#")]
    if not body:
        raise CorpusInputError(
            f"{label}: no dictionary entries found (empty or comments only). "
            f"Expected lines 'DE | ... :: EN | ...'. {FIX_HINT}")
    good = sum(1 for ln in body if ln.count(" :: ") == 1)
    if good < 0.9 * len(body):
        raise CorpusInputError(
            f"{label}: does not look like the Ding de-en dictionary: only "
            f"{good} of {len(body)} entry lines have the form "
            f"'DE | ... :: EN | ...'. {FIX_HINT}")


def read_ding_text(path: str) -> str:
    """Read and validate the Ding dictionary from a ``.deb`` or a text file.

    Raises :class:`CorpusInputError` with a message naming *path* and the fix
    when the file is missing, unreadable or in the wrong format.
    """
    if not os.path.exists(path):
        raise CorpusInputError(f"{path}: input file not found. {FIX_HINT}")
    if os.path.isdir(path):
        raise CorpusInputError(
            f"{path}: is a directory, expected a file. {FIX_HINT}")
    with open(path, "rb") as f:
        magic = f.read(8)
    if magic == b"!<arch>\n":
        text = read_ding_deb(path)
        label = f"{path}:{DING_MEMBER}"
    else:
        with open(path, "rb") as f:
            text = _decode(f.read(), path)
        label = path
    validate_ding_text(text, label)
    return text
