"""A record's audio clips: decoded, mixed to mono, resampled and capped once, here.

A clip is a file path (relative to the data file's folder), a base64 string (or a
`data:audio/...;base64,` URL), raw bytes, or `{"bytes": ..., "path": ...}` as a parquet
file written by `datasets` holds it; in any format libsndfile reads (WAV, FLAC, OGG,
MP3, ...). It comes out as float32 samples [N] at the model's feature extractor's rate,
at most `max_samples` of them: the model hears no more (Qwen2-Audio's extractor keeps
30 s), so no more is decoded. A header's claims (rate, channels, length) are checked
before anything is allocated from them: a clip is never read past the cap, whatever its
header promises.
"""

import io
from math import ceil, gcd

import numpy as np

from oxrl_core.data.images import media_bytes

MIN_RATE, MAX_RATE = 1_000, 384_000  # sample rates a real recording has
MAX_CHANNELS = 32


def read_audio(value, folder, index: int, rate: int, max_samples: int) -> np.ndarray:
    """Clip `index` of a record as float32 mono samples [N] at `rate` Hz, N <= max_samples; ValueError naming the
    clip for anything unreadable, empty or absurd."""
    data, name = media_bytes(value, folder, f"audio {index}", "audio")
    samples, source_rate = decode_audio(data, name, max_samples / rate)
    mono = samples.mean(axis=1)
    if source_rate != rate:
        from scipy.signal import resample_poly

        common = gcd(rate, source_rate)
        mono = resample_poly(mono, rate // common, source_rate // common).astype(np.float32)
    return np.ascontiguousarray(mono[:max_samples])


def decode_audio(data: bytes, name: str, max_seconds: float) -> tuple[np.ndarray, int]:
    """The first `max_seconds` of an encoded clip, float32 [frames, channels], and its sample rate; ValueError
    naming it (`name`) for anything libsndfile cannot read, a clip without samples, or a header no recording has."""
    import soundfile

    try:
        with soundfile.SoundFile(io.BytesIO(data)) as clip:
            if not MIN_RATE <= clip.samplerate <= MAX_RATE or not 1 <= clip.channels <= MAX_CHANNELS:
                raise ValueError(
                    f"{name}: header claims {clip.samplerate} Hz and {clip.channels} channel(s) (allowed: "
                    f"{MIN_RATE:,} to {MAX_RATE:,} Hz, 1 to {MAX_CHANNELS} channels)"
                )
            # never more than that is read, whatever length the header claims
            samples = clip.read(frames=ceil(max_seconds * clip.samplerate), dtype="float32", always_2d=True)
            rate = clip.samplerate
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as e:
        raise ValueError(f"{name}: not decodable audio ({str(e).splitlines()[0][:120]})") from None
    if len(samples) == 0:
        raise ValueError(f"{name}: no samples (an empty or truncated clip)")
    if not np.isfinite(samples).all():
        raise ValueError(f"{name}: samples that are not finite numbers")
    return samples, rate
