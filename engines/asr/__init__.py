"""Speech recognition: Whisper on CTranslate2 shared by every stream, Silero VAD per stream."""

from engines.asr.types import AsrInfo, AsrRequest, AsrResult, AsrUnavailable, AsrWord, SpeechRecognizer

__all__ = ["AsrInfo", "AsrRequest", "AsrResult", "AsrUnavailable", "AsrWord", "SpeechRecognizer"]
