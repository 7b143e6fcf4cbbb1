"""Images: read, checked and sized (data/media.py binds them to a record's conversation).

An image is a file path (relative to the data file's folder), a base64 string (or data
URI), raw bytes, or `{"bytes": ..., "path": ...}` as a parquet file written by
`datasets` holds it; any format Pillow reads, at most MAX_IMAGE_PIXELS pixels (checked
from the header, before decoding). Images are kept as uint8 arrays [H, W, 3]: a third
of the bytes of the float pixel values a processor makes from them per micro-batch.

Sizing (Qwen-VL): each image is resized here to the size the model's own processor would
give it (sides multiples of patch x merge pixels, the area within [min_pixels,
max_pixels]). The trainer's processor and vLLM's then both get an image already of such
a size, resize nothing, and agree on its number of image tokens.
"""

import base64
import binascii
import io
from pathlib import Path

import numpy as np

MAX_IMAGE_PIXELS = 40_000_000  # larger is refused as too large (decoding alone would take 120 MB and more)


def media_bytes(value, folder: Path, name: str, kind: str) -> tuple[bytes, str]:
    """The bytes of a media item given as a path, base64 string, `data:<kind>/...` URL, bytes or `datasets` feature
    (`{"bytes": ..., "path": ...}`), and its name for messages (with its path when it is a file); ValueError naming
    it for anything else."""
    if isinstance(value, dict):  # a `datasets` Image or Audio feature: bytes, else a path
        value = value.get("bytes") or value.get("path")
    if isinstance(value, str):
        path = Path(value).expanduser()
        path = path if path.is_absolute() else folder / path
        if value.startswith(f"data:{kind}/"):
            value = value.partition(",")[2]
        elif _is_file(path):
            value = path.read_bytes()
            name = f"{name} ({path})"
        if isinstance(value, str):
            try:
                value = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f"{name}: no such file {str(path)!r:.120} and not base64 data") from None
    if not isinstance(value, bytes | bytearray):
        raise ValueError(f"{name}: expected a path, base64 string or bytes, got {type(value).__name__}")
    return bytes(value), name


def read_image(value, folder: Path, index: int) -> np.ndarray:
    """Image `index` of a record as uint8 [H, W, 3]; ValueError naming it for anything unreadable."""
    from PIL import Image, UnidentifiedImageError

    data, name = media_bytes(value, folder, f"image {index}", "image")
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.width * image.height > MAX_IMAGE_PIXELS:
                raise ValueError(
                    f"{name}: {image.width}x{image.height} pixels is too large (at most {MAX_IMAGE_PIXELS:,})"
                )
            return np.array(
                image.convert("RGB"), dtype=np.uint8
            )  # writable: torch.from_numpy warns of a read-only array
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as e:
        raise ValueError(f"{name}: not a decodable image ({str(e).splitlines()[0][:120]})") from None


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a name too long for a path: base64 data
        return False


def qwen_sized(image: np.ndarray, factor: int, min_pixels: int, max_pixels: int, index: int) -> np.ndarray:
    """The image resized to the size Qwen-VL's processor would give it (its smart_resize: sides multiples of
    `factor`, patch x merge pixels, the area within [min_pixels, max_pixels])."""
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    height, width = image.shape[:2]
    try:
        size = smart_resize(height, width, factor, min_pixels, max_pixels)
    except ValueError as e:  # an aspect ratio above 200
        raise ValueError(f"image {index}: {width}x{height}: {e}") from None
    if size == (height, width):
        return image
    return np.array(Image.fromarray(image).resize(size[::-1], Image.Resampling.BICUBIC), dtype=np.uint8)
