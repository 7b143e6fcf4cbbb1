"""Checking the base64 media of multimodal records: images (`image`, `images`) and audio (`audio`, `audios`).

The media stay base64 text in the output; they are decoded here only to drop, with
a reason, a record whose bytes would not decode at training time. Images decode
with Pillow (any format it reads); audio with libsndfile, as training reads it
(data/audio.py: WAV, FLAC, OGG, MP3, ...), its first 30 s.
"""

import base64
import binascii
import io

from oxrl_core.data.audio import decode_audio

MEDIA_FIELDS = ("image", "images", "audio", "audios")
CHECKED_SECONDS = 30  # what Qwen2-Audio hears of a clip


def media_fields(record: dict) -> dict:
    """The media fields a record has (null ones count as absent: a parquet row holds every column)."""
    return {name: record[name] for name in MEDIA_FIELDS if record.get(name) is not None}


def check_media(media: dict) -> None:
    """ValueError(reason) unless every image decodes as an image and every clip as audio."""
    for one, many, check in (("image", "images", _check_image), ("audio", "audios", _check_audio)):
        if one in media:
            check(_decode_base64(media[one], one), one)
        if many in media:
            items = media[many]
            if not isinstance(items, list):
                raise ValueError(f"field {many!r} must be a list of base64 strings, got {type(items).__name__}")
            for i, item in enumerate(items):
                check(_decode_base64(item, f"{many}[{i}]"), f"{many}[{i}]")


def _decode_base64(value, name: str) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"field {name!r} must be a base64 string, got {type(value).__name__}")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as e:
        raise ValueError(f"field {name!r} is not valid base64 ({e})") from None


def _check_image(data: bytes, name: str) -> None:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()  # decodes the pixels: a truncated file fails here, not at open
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise ValueError(f"field {name!r} does not decode as an image ({e})") from None


def _check_audio(data: bytes, name: str) -> None:
    decode_audio(data, f"field {name!r}", CHECKED_SECONDS)
