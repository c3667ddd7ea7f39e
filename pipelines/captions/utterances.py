"""How caption finals (a few words each) are read back as utterances, by whoever joins them: a
final that starts within `UTTERANCE_PAUSE_S` of the last one's end, after no sentence end,
continues it. `vidsentry run` prints a line per utterance; the timeline indexes one entry per
utterance, so a phrase said across finals is found."""

from __future__ import annotations

UTTERANCE_PAUSE_S = 1.0
SENTENCE_STOPS = (".", "?", "!")  # a final ending in one of these ends its utterance
