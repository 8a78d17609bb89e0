"""The image files the search server sends (``GET /api/image/{id}``): read by index id only, inside the
indexed folder, with an ``ETag``; formats browsers do not show are converted to PNG. A file deleted,
unreadable or no longer decodable since it was indexed is a 404 saying so, never a 500: a file whose size or
mtime is no longer what the index recorded is decoded completely before it is sent, even in a format
browsers show (an image replaced by other content is not sent as ``image/png``, nor a JPEG cut short after
its header, which Pillow's ``verify`` alone accepts).

What the page shows is what was indexed: ``index build`` turns each image upright as its EXIF orientation
tag says, as browsers show a JPEG; a PNG or WebP with the tag (which browsers do not all apply) and every
converted format are sent turned upright here, as PNG without the tag."""

import hashlib
import io

from patchword.data.images import _strict_decoding, rgb_image
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
    if fmt in BROWSER_FORMATS and not _turned(data, fmt):
        return data, media_type, etag
    from PIL import Image, ImageOps

    try:
        with _strict_decoding(), Image.open(io.BytesIO(data)) as image:
            out = io.BytesIO()
            # upright and 8-bit as index build read it (rgb_image: 16-bit greyscale not clipped to white)
            rgb_image(ImageOps.exif_transpose(image)).save(out, format="PNG")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        # The file was replaced or truncated since it was indexed (UnidentifiedImageError is an OSError).
        raise BadRequest(404, _changed(image_id)) from err
    return out.getvalue(), "image/png", etag


#: Browser formats that may carry an EXIF orientation tag which browsers do not all apply (JPEG's they do),
#: with the name of the chunk holding EXIF data.
_TAGGED_FORMATS = {"PNG": b"eXIf", "WEBP": b"EXIF"}
_ORIENTATION = 0x0112  # the EXIF tag


def _turned(data: bytes, fmt: str) -> bool:
    """Whether the image in ``data`` (a browser format) has an EXIF orientation other than upright that a
    browser might not apply: it is then sent turned upright. A file without an EXIF chunk is not opened
    (Pillow decodes a whole PNG to find one after the pixel data)."""
    chunk = _TAGGED_FORMATS.get(fmt)
    if chunk is None or chunk not in data:
        return False
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.getexif().get(_ORIENTATION, 1) != 1
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        return False  # sent as it is: the conversion would fail the same way


def _verified_format(data: bytes, image_id: int) -> str:
    """The Pillow format of ``data`` once :meth:`PIL.Image.Image.verify` accepts it (header and, for PNG, the
    chunks' checksums) and its pixels (the first frame's) decode completely: ``verify`` decodes no pixel, so
    a JPEG cut short after its header passes it. Pillow's ``LOAD_TRUNCATED_IMAGES`` is off meanwhile, whatever
    the process set (it would decode a truncated file as far as it goes).

    Raises:
        BadRequest: 404, it is not an image Pillow reads completely.
    """
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            fmt = image.format or ""
            image.verify()
        with _strict_decoding(), Image.open(io.BytesIO(data)) as image:  # verify() leaves it unusable
            image.load()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise BadRequest(404, _changed(image_id)) from err
    return fmt


def _changed(image_id: int) -> str:
    return (
        f"the file of image {image_id} changed since it was indexed and cannot be read; "
        "run index build --update"
    )
