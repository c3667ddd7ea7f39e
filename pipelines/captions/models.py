"""The recognizers the caption stages share, by model name, for streams that choose their own.

The `captions:` section's model serves every stream that names none; a stream may name another
(`streams[].captions.model`), which is loaded when the first such stream starts and closed when
the last one ends, so a model no stream uses holds no memory and no claim on the cores. At most
`captions.max_models` are loaded at once, the section's included: a stream that would need one
more is refused where it is configured or added (`problem`), and should one get past that (two
added at once, a fleet worker's other config), its captions stay off with the reason logged; no
model is ever closed under a stream using it. Loading runs on a thread: the streams already
captioned go on meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

from engines.asr.types import SpeechRecognizer
from pipelines.captions.engine import SpeechBatcher
from pipelines.errors import PipelineError

log = logging.getLogger(__name__)


class ModelRefused(PipelineError):
    """A stream named a model this service cannot serve now; the message says why and what it has."""


@dataclass(frozen=True, slots=True)
class ServedModel:
    """One recognizer as the stages reach it: its streaming decodes' batcher and its transcripts'."""

    batcher: SpeechBatcher
    transcripts: SpeechBatcher | None = None

    @property
    def batchers(self) -> tuple[SpeechBatcher, ...]:
        return (self.batcher,) if self.transcripts is None else (self.batcher, self.transcripts)

    @property
    def transcriber(self) -> SpeechBatcher:
        return self.transcripts or self.batcher

    @property
    def name(self) -> str:
        return self.batcher.recognizer.info.name

    @property
    def multilingual(self) -> bool:
        return bool(getattr(self.batcher.recognizer, "multilingual", False))


@dataclass(slots=True)
class _Loaded:
    served: ServedModel
    closing: contextlib.AsyncExitStack
    users: int = 0


Serve = Callable[[SpeechRecognizer], AbstractAsyncContextManager[ServedModel]]


@dataclass(eq=False)
class ModelShelf:
    """The section's model (`default`, always loaded) and those streams name, loaded while used."""

    default_name: str
    default: ServedModel
    load: Callable[[str], SpeechRecognizer]  # blocking: a model by name (run on a thread)
    serve: Serve  # a loaded recognizer's batchers, with their claims on the compute budget
    # Why a model cannot be loaded here (not installed, an altered part), None: it can.
    unavailable: Callable[[str], str | None]
    max_models: int = 2
    # Recognizers loaded by someone else (the tests' session models): served, never closed here.
    lent: Mapping[str, SpeechRecognizer] = field(default_factory=dict)
    _loaded: dict[str, _Loaded] = field(default_factory=dict)
    # Models whose load failed (an altered part is only found by joining the parts): refused from then
    # on with that reason, until the service starts again.
    _failed: dict[str, str] = field(default_factory=dict)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    refused: int = 0  # streams whose model could not be served (their captions stayed off)

    @property
    def names(self) -> list[str]:
        """The models loaded now, the section's first."""
        return [self.default_name, *self._loaded]

    @property
    def served(self) -> list[ServedModel]:
        return [self.default, *(entry.served for entry in self._loaded.values())]

    def problem(self, name: str, *, also: frozenset[str] = frozenset()) -> str | None:
        """Why a stream naming `name` would be refused now (None: it would be served); `also`: models
        other streams being checked with it will load."""
        loaded = {self.default_name, *self._loaded, *also}
        if name in loaded:
            return None
        if name in self._failed:
            return self._failed[name]
        if name not in self.lent and (reason := self.unavailable(name)) is not None:
            return f"model {name} cannot be loaded here: {reason}"
        if len(loaded) >= self.max_models:
            return (f"captions.max_models is {self.max_models} and {', '.join(sorted(loaded))} "
                    f"{'is' if len(loaded) == 1 else 'are'} loaded; model {name} would be one more")
        return None

    @contextlib.asynccontextmanager
    async def lease(self, name: str) -> AsyncIterator[ServedModel]:
        """The model served for the duration, loaded first if no stream had it; ModelRefused when it
        cannot be (the bound, or the model itself)."""
        if name == self.default_name:
            yield self.default
            return
        entry = await self._take(name)
        try:
            yield entry.served
        finally:
            entry.users -= 1
            if entry.users == 0 and self._loaded.get(name) is entry:
                del self._loaded[name]
                log.info("captions: model closed, no stream uses it", extra={"model": name})
                await entry.closing.aclose()

    async def _take(self, name: str) -> _Loaded:
        async with self._lock:  # one load at a time: two streams naming one model load it once
            entry = self._loaded.get(name)
            if entry is None:
                if (reason := self.problem(name)) is not None:
                    self.refused += 1
                    raise ModelRefused(reason)
                entry = await self._open(name)
                self._loaded[name] = entry
            entry.users += 1
            return entry

    async def _open(self, name: str) -> _Loaded:
        closing = contextlib.AsyncExitStack()
        lent = self.lent.get(name)
        try:
            if lent is None:
                log.info("captions: loading a model a stream names", extra={"model": name})
                recognizer = await asyncio.to_thread(self.load, name)
                closing.callback(recognizer.close)
            else:
                recognizer = lent
            served = await closing.enter_async_context(self.serve(recognizer))
        except BaseException as exc:
            await closing.aclose()
            if isinstance(exc, Exception):
                self.refused += 1
                self._failed[name] = f"model {name} could not be loaded: {exc}"
                raise ModelRefused(self._failed[name]) from exc
            raise
        return _Loaded(served, closing)

    async def aclose(self) -> None:
        """Close what streams still hold (the service is stopping: their stages have ended)."""
        loaded, self._loaded = self._loaded, {}
        for entry in loaded.values():
            await entry.closing.aclose()
