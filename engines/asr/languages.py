"""The languages the multilingual Whisper models know, by the code their tokenizer writes.

A code outside this list fails the decode it is asked for, and with it every request batched
beside it (other streams' too): settings check a code against this list before anything runs.
"""

from __future__ import annotations

# As the multilingual models' tokenizer.json writes them (<|en|> ... <|su|>): 99 codes.
WHISPER_LANGUAGES: frozenset[str] = frozenset({
    "en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca", "nl", "ar", "sv", "it", "id", "hi", "fi",
    "vi", "he", "uk", "el", "ms", "cs", "ro", "da", "hu", "ta", "no", "th", "ur", "hr", "bg", "lt", "la", "mi", "ml",
    "cy", "sk", "te", "fa", "lv", "bn", "sr", "az", "sl", "kn", "et", "mk", "br", "eu", "is", "hy", "ne", "mn", "bs",
    "kk", "sq", "sw", "gl", "mr", "pa", "si", "km", "sn", "yo", "so", "af", "oc", "ka", "be", "tg", "sd", "gu", "am",
    "yi", "lo", "uz", "fo", "ht", "ps", "tk", "nn", "mt", "sa", "lb", "my", "bo", "tl", "mg", "as", "tt", "haw", "ln",
    "ha", "ba", "jw", "su",
})


def check_language(code: str) -> str:
    """The code, lower-cased, if Whisper knows it; ValueError saying what a code looks like otherwise."""
    value = code.strip().lower()
    if value not in WHISPER_LANGUAGES:
        raise ValueError(f"language {code!r} is not one Whisper knows: a code such as en, es, fr, de, zh, or auto")
    return value
