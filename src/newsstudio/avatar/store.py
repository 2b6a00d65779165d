"""Where avatars live and how a user names one: an id, a packet folder, or a source file.

Ids are plain names (letters, digits, `_`, `-`) under the avatars root (`--avatars DIR`,
`$NEWSSTUDIO_AVATARS`, default `./avatars`); nothing a user types can escape that folder. A
source video/photo given instead of an id is prebaked once and cached under an id derived
from its name and content hash, so the second render starts instantly.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from .packet import MANIFEST, Packet, PacketError, open_packet

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def avatars_root(root: str | os.PathLike[str] | None = None) -> Path:
    return Path(root or os.environ.get("NEWSSTUDIO_AVATARS", "avatars"))


def validate_id(avatar_id: str) -> str:
    """Reject ids that are not plain names (path tricks such as '../x' or 'a/b')."""
    if not isinstance(avatar_id, str) or not _ID.match(avatar_id):
        raise ValueError(f"invalid avatar id {avatar_id!r}: use 1-64 letters, digits, '_' or '-', starting with a letter or digit")
    return avatar_id


def packet_dir(avatar_id: str, root: str | os.PathLike[str] | None = None) -> Path:
    return avatars_root(root) / validate_id(avatar_id)


def source_digest(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def cached_id_for(source: Path) -> str:
    stem = re.sub(r"[^A-Za-z0-9_-]", "_", source.stem)[:40] or "avatar"
    if not stem[0].isalnum():
        stem = "a" + stem
    return f"{stem}-{source_digest(source)[:10]}"


def resolve_avatar(ref: str | os.PathLike[str], root: str | os.PathLike[str] | None = None, **prebake_kw) -> Packet:
    """Open an avatar given as a packet folder, an id under the root, a source media file, or a
    built-in demo face (`builtin:astronaut`)."""
    from ..builtin import builtin_image, is_builtin

    if is_builtin(ref):
        ref = builtin_image(str(ref), avatars_root(root) / ".sources")
    p = Path(ref)
    if p.is_dir():
        return open_packet(p)
    if p.is_file():
        aid = cached_id_for(p)
        dest = packet_dir(aid, root)
        if (dest / MANIFEST).is_file():
            packet = open_packet(dest)
            if packet.meta.get("source", {}).get("sha256") == source_digest(p) and _same_options(packet, prebake_kw):
                return packet
        from .prebake import prebake

        return prebake(p, aid, root=root, **prebake_kw)
    ref_s = str(ref)
    if _ID.match(ref_s):
        d = packet_dir(ref_s, root)
        if d.is_dir():
            return open_packet(d)
        raise PacketError(f"no avatar {ref_s!r} under {avatars_root(root)} (build it with `newsstudio prebake SOURCE --id {ref_s}`)")
    raise PacketError(f"avatar {ref_s!r} is neither a packet folder, an avatar id, nor a media file")


def _same_options(packet: Packet, kw: dict) -> bool:
    size = kw.get("size")
    return size is None or tuple(packet.size) == tuple(size)
