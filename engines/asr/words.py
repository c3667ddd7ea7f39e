"""Word timings from CTranslate2's token alignment (DTW over Whisper's alignment heads).

Tokens are grouped into words the way Whisper spells them (a word starts at a leading space or a
punctuation mark; scripts without spaces split per character), then punctuation is folded into its
neighbour so " morning." is one word. Times come from the first alignment step of each token.
Words aligned after the end of the audio are dropped; the rest are clipped to [0, duration].
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence

import numpy as np

from engines.asr.types import AsrWord

SECONDS_PER_STEP = 0.02  # one encoder position = 2 mel frames
PREPEND = "\"'“¿([{-"
APPEND = "\"'.。,，!！?？:：”)]}、"
SENTENCE_END = ".。!！?？"
PAST_END = 0.1  # s: a word starting this far past the audio was decoded from the silence after it
NO_SPACE_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "my", "yue"})

Decode = Callable[[list[int]], str]


def split_words(tokens: Sequence[int], decode: Decode, language: str) -> list[tuple[str, list[int]]]:
    """Group text tokens into (word, tokens); joining the words gives the decoded text."""
    pieces: list[tuple[str, list[int]]] = []
    current: list[int] = []
    for token in tokens:
        current.append(token)
        text = decode(current)
        if "\ufffd" not in text:  # a token may end inside a multi-byte character: wait for the rest
            pieces.append((text, current))
            current = []
    if current:
        pieces.append((decode(current), current))
    if language in NO_SPACE_LANGUAGES:
        return pieces
    words: list[tuple[str, list[int]]] = []
    for text, toks in pieces:
        starts_word = text.startswith(" ") or text.strip() in string.punctuation or not words
        if starts_word:
            words.append((text, list(toks)))
        else:
            last_text, last_toks = words[-1]
            words[-1] = (last_text + text, last_toks + toks)
    return words


def align_words(
    words: list[tuple[str, list[int]]],
    alignments: Sequence[tuple[int, int]],
    token_probs: Sequence[float],
    duration: float,
) -> tuple[AsrWord, ...]:
    """Turn one alignment result into timed words, clipped to [0, duration] and in time order."""
    if not words or not alignments:
        return ()
    text_index = np.array([pair[0] for pair in alignments])
    time_index = np.array([pair[1] for pair in alignments])
    # The DTW path visits every token; the time where the text index first changes is a token's start.
    first_step = np.concatenate(([True], np.diff(text_index) != 0))
    token_times = time_index[first_step] * SECONDS_PER_STEP
    bounds = np.concatenate(([0], np.cumsum([len(toks) for _, toks in words])))
    bounds = np.minimum(bounds, len(token_times) - 1)
    probs = np.asarray(token_probs, dtype=np.float64)
    timed = []
    for i, (text, _) in enumerate(words):
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        prob = float(probs[lo:hi].mean()) if hi > lo and hi <= len(probs) else 0.0
        timed.append([text, float(token_times[lo]), float(token_times[hi]), prob])
    _limit_long_words(timed)
    merged = _merge_punctuation(timed)
    # Alignment may run past the audio into the silence after it; words placed there are not in the
    # audio (a decoder that does not stop repeats itself or starts over, and DTW puts that in the tail).
    merged = [w for w in merged if w[1] < duration + PAST_END]
    return _clip(merged, duration)


def _limit_long_words(timed: list[list]) -> None:
    """DTW stretches words across pauses; trim them at sentence ends and at the clip's first word."""
    durations = np.array([end - start for _, start, end, _ in timed])
    nonzero = durations[durations > 0]
    if nonzero.size == 0:
        return
    median = min(0.7, float(np.median(nonzero)))
    longest = 2 * median
    for i in range(1, len(timed)):
        word, start, end = timed[i][0], timed[i][1], timed[i][2]
        if end - start > longest:
            if word in SENTENCE_END:
                timed[i][2] = start + longest
            elif timed[i - 1][0] in SENTENCE_END:
                timed[i][1] = end - longest
    first = timed[0]
    if first[2] > 4 * median and first[2] - first[1] > longest:  # speech begins after a pause
        first[1] = max(0.0, first[2] - longest)


def _merge_punctuation(timed: list[list]) -> list[list]:
    """A " ." after a word joins that word; an opening quote or bracket joins the word after it."""
    out: list[list] = []
    carry = ""
    for entry in timed:
        word = carry + entry[0]
        carry = ""
        stripped = word.strip()
        if stripped and stripped in PREPEND and word.startswith(" ") and entry is not timed[-1]:
            carry = word
            continue
        if out and word in APPEND and not out[-1][0].endswith(" "):
            out[-1][0] += word
            continue
        out.append([word, entry[1], entry[2], entry[3]])
    if carry and out:
        out[-1][0] += carry
    return out


def _clip(timed: list[list], duration: float) -> tuple[AsrWord, ...]:
    words = []
    previous_start = 0.0
    for word, raw_start, raw_end, prob in timed:
        if not word.strip():
            continue
        start = min(max(raw_start, previous_start, 0.0), duration)
        end = min(max(raw_end, start), duration)
        words.append(AsrWord(word=word, start=round(start, 3), end=round(end, 3), probability=round(prob, 4)))
        previous_start = start
    return tuple(words)
