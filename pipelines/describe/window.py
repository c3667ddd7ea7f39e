"""One stream's conversation with the VLM, laid out for vLLM's automatic prefix caching.

vLLM caches a request's KV blocks by a hash chain over its tokens (and images, by content, at
their position): a request reuses everything up to the first token that differs from one seen
before, and the blocks of the answer it generated too. So the window only ever grows at its end:

    system     the settings' system prompt, byte-identical for every stream and request
    user       epoch header (the previous epoch's last description as its summary)
               [t=…] frame, [t=…] speech: "…", [t=…] frame, …  + the description instruction
    assistant  the description, as generated
    user       [t=…] frame, …  + the instruction (a description's stays; a check's question does not)

Every request is the window so far, the items not yet sent (in time order), and a short
instruction last; items become part of the window as they are sent. A description request keeps
its instruction and then its answer, so the next request begins with exactly the tokens the
server saw and generated: all of it is cached but the new items and the new tail. A sliding
window would change the tokens right after the system prompt and miss everything; instead, at a
frame or token budget the window starts a new epoch whose header carries the last description.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from engines.vlm.types import VlmImage, VlmMessage, VlmPart, VlmText
from pipelines.describe.settings import DescribeSettings

TILE_PX = 28  # Qwen2.5-VL: one token per 28x28 pixels (after 2x2 patch merging)
IMAGE_MARKER_TOKENS = 2  # <|vision_start|> … <|vision_end|>
BYTES_PER_TOKEN = 4  # a deliberately rough text estimate; only budgets use it
MESSAGE_TOKENS = 4  # role markers around each message
MAX_PENDING_SPEECH = 32  # caption segments waiting for a request; older ones are dropped
CONTEXT_MARGIN = 0.8  # of the server's context length an epoch may fill (the estimate is rough)


def image_tokens(size: tuple[int, int]) -> int:
    width, height = size
    return max(1, round(width / TILE_PX)) * max(1, round(height / TILE_PX)) + IMAGE_MARKER_TOKENS


def text_tokens(text: str) -> int:
    return -(-len(text.encode("utf-8")) // BYTES_PER_TOKEN)


def stamp(t: float) -> str:
    return f"[t={t:.1f}s]"


@dataclass(frozen=True, slots=True)
class WindowFrame:
    t: float  # stream clock (never runs backwards)
    pts: float  # media time, for events
    captured_at: float
    image: VlmImage


@dataclass(frozen=True, slots=True)
class WindowSpeech:
    t: float
    text: str


Item = WindowFrame | WindowSpeech


@dataclass(frozen=True, slots=True)
class WindowRequest:
    """What one request is made of, and what its description event reports."""

    epoch: int
    messages: tuple[VlmMessage, ...]
    frames: int  # in the whole request
    window_start_pts: float | None  # the epoch's first frame
    window_end_pts: float | None  # the newest frame sent
    newest_captured_at: float | None  # capture time of that frame (description lag is measured from it)
    tokens: int  # the estimate budgets are checked against


@dataclass(slots=True)
class _Segment:
    role: Literal["user", "assistant"]
    parts: list[VlmPart]


class DescribeWindow:
    """Pure and synchronous; the stage owns one per stream."""

    def __init__(self, settings: DescribeSettings) -> None:
        self.settings = settings
        self.image_tokens = image_tokens(settings.frame_size)
        self._system = VlmMessage("system", (VlmText(settings.system_prompt),))
        self._system_tokens = text_tokens(settings.system_prompt) + MESSAGE_TOKENS
        self.token_limit = settings.max_prompt_tokens  # lowered when the server says its context is smaller
        self.epoch = 0
        self.summary: str | None = None
        self._start(summary=None)

    def _start(self, summary: str | None) -> None:
        self.epoch += 1
        self.summary = summary
        self._segments: list[_Segment] = []
        self._pending: list[Item] = []
        self._sent_frames = 0
        self._tokens = self._system_tokens
        self._first_pts: float | None = None
        self._newest: WindowFrame | None = None
        self._last_answer: str | None = None

    # -- what the window holds -------------------------------------------------------------------

    @property
    def frames(self) -> int:
        """Frames in the epoch, sent or waiting."""
        return self._sent_frames + sum(isinstance(i, WindowFrame) for i in self._pending)

    @property
    def tokens(self) -> int:
        """Estimated prompt tokens of the epoch so far, pending items included, no instruction."""
        return self._tokens + sum(self._item_tokens(i) for i in self._pending)

    @property
    def has_new(self) -> bool:
        """Frames or speech wait that no request has carried yet."""
        return bool(self._pending)

    @property
    def has_new_frame(self) -> bool:
        """A frame waits that no request has carried yet."""
        return any(isinstance(i, WindowFrame) for i in self._pending)

    @property
    def started(self) -> bool:
        """A request of this epoch went out: its header and first items are fixed."""
        return bool(self._segments)

    @property
    def newest_frame(self) -> WindowFrame | None:
        pending = [i for i in self._pending if isinstance(i, WindowFrame)]
        return max(pending, key=lambda f: f.t) if pending else self._newest

    def full(self, *, extra_frames: int = 1, image_limit: int | None = None, reserve: int = 0) -> bool:
        """Would `extra_frames` more frames break a budget (frames, the server's image limit,
        prompt tokens with `reserve` left for the tail and the answer)?"""
        frames = self.frames + extra_frames
        limit = self.settings.max_frames if image_limit is None else min(self.settings.max_frames, image_limit)
        if frames > limit:
            return True
        return self.tokens + extra_frames * self._frame_cost() + reserve > self.token_limit

    def fit_context(self, context_tokens: int) -> None:
        """The server's context is `context_tokens` (prompt and answer): keep epochs well inside it,
        as token counts here are estimates."""
        self.token_limit = min(self.token_limit, int(context_tokens * CONTEXT_MARGIN))

    # -- changes ------------------------------------------------------------------------------------

    def add_frame(self, frame: WindowFrame) -> None:
        self._pending.append(frame)

    def add_speech(self, t: float, text: str) -> None:
        text = " ".join(text.split())[: self.settings.max_transcript_chars]
        if not text:
            return
        self._pending.append(WindowSpeech(t, text))
        # Speech waits for the next request, which waits for a frame: a picture that froze while
        # the sound goes on must not let it pile up.
        speech = [i for i in self._pending if isinstance(i, WindowSpeech)]
        if len(speech) > MAX_PENDING_SPEECH:
            self._pending.remove(speech[0])

    def answer(self, epoch: int, text: str) -> None:
        """A description came back. It joins the window (so the next one knows what was said
        already) when it belongs to this epoch; any description is the next epoch's summary."""
        if epoch != self.epoch:
            if not self.started:  # the new epoch's header is not fixed yet: take the fresher summary
                self.summary = text
            return
        self._last_answer = text
        self._segments.append(_Segment("assistant", [VlmText(text)]))
        self._tokens += text_tokens(text) + MESSAGE_TOKENS

    def roll(self, *, keep_newest: bool = False) -> None:
        """Start a new epoch: the last description becomes its summary. Speech not yet sent moves
        along; so does the newest frame when `keep_newest` (the new epoch needs something to see)."""
        summary = self._last_answer or self.summary
        newest = self.newest_frame
        carried: list[Item] = [i for i in self._pending if isinstance(i, WindowSpeech)]
        if keep_newest and newest is not None:
            carried.append(newest)
        self._start(summary)
        self._pending = sorted(carried, key=lambda i: i.t)

    def request(self, instruction: str, *, keep: bool = False) -> WindowRequest:
        """The next request: the window, the waiting items (now sent, fixed in the window), and
        `instruction` last. A description's instruction is `keep`: it stays in the window with the
        answer after it, so the next request repeats this one's prompt and answer exactly as vLLM
        saw and generated them, and all of it is cached. An alert check's is not kept: its
        question and answer would only be noise in the descriptions' history."""
        if self._pending or keep:
            self._send(sorted(self._pending, key=lambda i: i.t))  # stable: equal times keep arrival order
            self._pending = []
        if keep:
            self._segments[-1].parts.append(VlmText(instruction))
            self._tokens += text_tokens(instruction)
        messages = [self._system] + [VlmMessage(s.role, tuple(s.parts)) for s in self._segments]
        if not keep:
            tail = VlmText(instruction)
            last = messages[-1]
            if last.role == "user":
                messages[-1] = VlmMessage("user", (*last.parts, tail))
            else:
                messages.append(VlmMessage("user", (tail,)))
        newest = self._newest
        return WindowRequest(
            epoch=self.epoch,
            messages=tuple(messages),
            frames=self._sent_frames,
            window_start_pts=self._first_pts,
            window_end_pts=newest.pts if newest else None,
            newest_captured_at=newest.captured_at if newest else None,
            tokens=self._tokens + (0 if keep else text_tokens(instruction)),
        )

    def _send(self, items: Sequence[Item]) -> None:
        if not self._segments:
            header = self._header()
            self._segments.append(_Segment("user", [VlmText(header)]))
            self._tokens += text_tokens(header) + MESSAGE_TOKENS
        elif self._segments[-1].role == "assistant":
            self._segments.append(_Segment("user", []))
            self._tokens += MESSAGE_TOKENS
        parts = self._segments[-1].parts
        for item in items:
            self._tokens += self._item_tokens(item)
            if isinstance(item, WindowFrame):
                parts += [VlmText(stamp(item.t)), item.image]
                self._sent_frames += 1
                if self._first_pts is None:
                    self._first_pts = item.pts
                if self._newest is None or item.t >= self._newest.t:
                    self._newest = item
            else:
                parts.append(VlmText(f'{stamp(item.t)} speech: "{item.text}"'))

    def _header(self) -> str:
        if self.summary is None:
            return f"Epoch {self.epoch}. The stream has just started."
        return f"Epoch {self.epoch}. Summary of the scene before: {self.summary}"

    def _frame_cost(self) -> int:
        return self.image_tokens + text_tokens(stamp(0.0))

    def _item_tokens(self, item: Item) -> int:
        if isinstance(item, WindowFrame):
            return self._frame_cost()
        return text_tokens(f'{stamp(item.t)} speech: "{item.text}"')
