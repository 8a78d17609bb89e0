"""The image files the search server sends (``GET /api/image/{id}``): read by index id only, inside the
indexed folder, with an ``ETag``; formats browsers do not show are converted to PNG. A file deleted,
unreadable or no longer decodable since it was indexed is a 404 saying so, never a 500: a file whose size or
mtime is no longer what the index recorded is decoded (verified) before it is sent, even in a format
browsers show (an image replaced by other content is not sent as ``image/png``)."""

import hashlib
import io

from patchword.search.query import Searcher
from patchword.serve.params import BadRequest

__all__ = ["BROWSER_FORMATS", "etag_matches", "image_bytes"]

#: Pillow formats sent as stored; anything else is converted to PNG on the way out.
BROWSER_FORMATS = {
    "PNG": "image/png",
    "JPEG": "image/jpeg",
    "MPO": "image/jpeg",  # a JPEG with extra frames (phone cameras): browsers show its first, as Pillow reads
    "GIF": "image/gif",
    "WEBP": "image/webp",
    "BMP": "image/bmp",
}


def etag_matches(header: str | None, etag: str) -> bool:
    """Whether an ``If-None-Match`` header names ``etag`` (weak comparison, as RFC 9110 asks of it)."""
    if header is None:
        return False
    tags = [tag.strip().removeprefix("W/") for tag in header.split(",")]
    return "*" in tags or etag in tags


def image_bytes(
    searcher: Searcher, image_id: int, if_none_match: str | None = None
) -> tuple[bytes | None, str, str]:
    """The file of ``image_id`` as (bytes, media type, ETag), bytes None when ``if_none_match`` names the
    ETag (the client's copy is current: nothing is read). Only paths recorded in the index are read, and
    only inside the indexed folder (a symbolic link swapped in later cannot lead outside).

    The ETag is the image's path, size and mtime: an index id names another image after an update (which the
    server reopens), so a browser revalidates what it cached under an id rather than keep it for a time."""
    index = searcher.index
    entry = index.entries[image_id]
    root = index.images_root.resolve()
    path = (root / entry.path).resolve()
    try:
        path.relative_to(root)
    except ValueError as err:
        raise BadRequest(404, f"image {image_id} is no longer inside the indexed folder") from err
    if not path.is_file():
        raise BadRequest(404, f"the file of image {image_id} no longer exists")
    try:
        stat = path.stat()
    except OSError as err:  # deleted since the check above, or no longer readable
        raise BadRequest(404, f"the file of image {image_id} no longer exists") from err
    version = f"{entry.path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode("utf-8", "surrogateescape")
    etag = f'"{hashlib.sha256(version).hexdigest()[:32]}"'
    media_type = BROWSER_FORMATS.get(entry.format, "image/png")
    if etag_matches(if_none_match, etag):
        return None, media_type, etag
    try:
        data = path.read_bytes()
    except OSError as err:  # permissions changed, or deleted meanwhile: the user's file, not a server fault
        raise BadRequest(404, _changed(image_id)) from err
    fmt = entry.format
    if (stat.st_size, stat.st_mtime_ns) != (entry.size, entry.mtime_ns):
        # changed since it was indexed (as an update would see it): sent only if it still decodes, as what
        # it is now
        fmt = _verified_format(data, image_id)
        media_type = BROWSER_FORMATS.get(fmt, "image/png")
    if fmt in BROWSER_FORMATS:
        return data, media_type, etag
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            out = io.BytesIO()
            image.convert("RGB").save(out, format="PNG")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        # The file was replaced or truncated since it was indexed (UnidentifiedImageError is an OSError).
        raise BadRequest(404, _changed(image_id)) from err
    return out.getvalue(), media_type, etag


def _verified_format(data: bytes, image_id: int) -> str:
    """The Pillow format of ``data`` once :meth:`PIL.Image.Image.verify` accepts it (header and, for PNG, the
    chunks' checksums, without decoding the pixels).

    Raises:
        BadRequest: 404, it is not an image Pillow reads.
    """
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            fmt = image.format or ""
            image.verify()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise BadRequest(404, _changed(image_id)) from err
    return fmt


def _changed(image_id: int) -> str:
    return (
        f"the file of image {image_id} changed since it was indexed and cannot be read; "
        "run index build --update"
    )
