"""Checking the base64 media of multimodal records: images (`image`, `images`) and audio (`audio`).

The media stay base64 text in the output; they are decoded here only to drop, with
a reason, a record whose bytes would not decode at training time. Images decode
with Pillow (any format it reads); audio decodes with the standard library's
`wave`, so only PCM WAV is accepted (no FLAC/MP3 decoder is installed).
"""

import base64
import binascii
import io
import wave

MEDIA_FIELDS = ("image", "images", "audio")


def media_fields(record: dict) -> dict:
    """The media fields a record has (null ones count as absent: a parquet row holds every column)."""
    return {name: record[name] for name in MEDIA_FIELDS if record.get(name) is not None}


def check_media(media: dict) -> None:
    """ValueError(reason) unless every image decodes as an image and the audio as PCM WAV."""
    if "image" in media:
        _check_image(_decode_base64(media["image"], "image"), "image")
    if "images" in media:
        images = media["images"]
        if not isinstance(images, list):
            raise ValueError(f"field 'images' must be a list of base64 strings, got {type(images).__name__}")
        for i, image in enumerate(images):
            _check_image(_decode_base64(image, f"images[{i}]"), f"images[{i}]")
    if "audio" in media:
        _check_wav(_decode_base64(media["audio"], "audio"))


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


def _check_wav(data: bytes) -> None:
    try:
        with wave.open(io.BytesIO(data)) as audio:
            frames = audio.readframes(audio.getnframes())
            expected = audio.getnframes() * audio.getnchannels() * audio.getsampwidth()
    except (wave.Error, EOFError) as e:
        reason = str(e) or "the data ends early"  # EOFError comes without a message
        raise ValueError(f"field 'audio' does not decode as PCM WAV, the one audio format checked ({reason})") from None
    if len(frames) != expected:
        raise ValueError(f"field 'audio' is truncated: {len(frames)} bytes of samples, its header promises {expected}")
