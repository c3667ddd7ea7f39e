"""The describer's window: append-only within an epoch (each request is the previous one minus its
instruction, plus new items), chronological, and rolled into a new epoch at its budgets."""

from __future__ import annotations

import numpy as np
import pytest

from engines.vlm.images import encode_image
from engines.vlm.types import VlmImage, VlmMessage, VlmText
from pipelines.describe.settings import DescribeSettings
from pipelines.describe.window import DescribeWindow, WindowFrame, image_tokens

INSTRUCTION = "Describe the scene now."


def frame(t: float, shade: int | None = None) -> WindowFrame:
    pixels = np.full((72, 128, 3), int(t * 10) % 256 if shade is None else shade, np.uint8)
    pixels[: int(t) % 72, :, 0] = 255  # each time its own picture
    return WindowFrame(t, pts=t + 100.0, captured_at=1_700_000_000.0 + t, image=encode_image(pixels, (112, 56)))


def flat(messages: tuple[VlmMessage, ...]) -> list[tuple[str, str]]:
    """The request as vLLM tokenises it, in order: role markers, texts, images by content."""
    out: list[tuple[str, str]] = []
    for message in messages:
        out.append(("start", message.role))
        for part in message.parts:
            out.append(("text", part.text) if isinstance(part, VlmText) else ("image", part.digest))
        out.append(("end", message.role))
    return out


def test_every_request_extends_the_previous_one_byte_for_byte() -> None:
    window = DescribeWindow(DescribeSettings(max_frames=100))
    previous: list[tuple[str, str]] | None = None
    for step in range(12):
        window.add_frame(frame(step * 1.0))
        if step % 3 == 1:
            window.add_speech(step - 0.5, "  hello   there ")
        check = step % 4 == 3
        instruction = "check?" if check else INSTRUCTION
        request = window.request(instruction, keep=not check)
        tokens = flat(request.messages)
        assert tokens[0] == ("start", "system")
        assert tokens[-2] == ("text", instruction)  # the volatile part is last
        if previous is not None:
            assert tokens[: len(previous)] == previous
        # What the next request repeats: a description's instruction stays (its answer follows it),
        # a check's question does not; the end of the last turn may not come where it was.
        previous = tokens[:-2] if check else tokens[:-1]
        if step % 2 == 0 and not check:
            window.answer(request.epoch, f"answer {step}")
            previous += [("end", "user"), ("start", "assistant"), ("text", f"answer {step}"), ("end", "assistant")]
    assert window.epoch == 1
    assert request.frames == 12


def test_a_description_keeps_its_instruction_before_its_answer_a_check_does_not() -> None:
    window = DescribeWindow(DescribeSettings())
    window.add_frame(frame(1.0))
    described = window.request(INSTRUCTION, keep=True)
    window.add_frame(frame(2.0))
    window.request("check?")
    window.answer(described.epoch, "Empty hallway.")
    window.add_frame(frame(3.0))
    texts = [
        (m.role, p.text if isinstance(p, VlmText) else "<image>")
        for m in window.request(INSTRUCTION, keep=True).messages[1:]
        for p in m.parts
    ]
    assert texts == [
        ("user", "Epoch 1. The stream has just started."),
        ("user", "[t=1.0s]"),
        ("user", "<image>"),
        ("user", INSTRUCTION),
        ("user", "[t=2.0s]"),
        ("user", "<image>"),
        ("assistant", "Empty hallway."),
        ("user", "[t=3.0s]"),
        ("user", "<image>"),
        ("user", INSTRUCTION),
    ]


def test_the_system_prompt_is_the_same_for_every_stream_and_epoch() -> None:
    one, two = DescribeWindow(DescribeSettings(max_frames=2)), DescribeWindow(DescribeSettings(max_frames=2))
    one.add_frame(frame(1.0))
    two.add_frame(frame(7.0))
    two.roll()
    two.add_frame(frame(8.0))
    first, second = one.request(INSTRUCTION).messages[0], two.request(INSTRUCTION).messages[0]
    assert first == second and first.role == "system"


def test_items_are_in_time_order_and_stamped() -> None:
    window = DescribeWindow(DescribeSettings())
    window.add_frame(frame(2.0))
    window.add_speech(1.5, "a door opens")  # speech arrives after the frame that followed it
    window.add_frame(frame(3.0))
    parts = window.request(INSTRUCTION).messages[1].parts
    texts = [p.text if isinstance(p, VlmText) else "<image>" for p in parts]
    assert texts == [
        "Epoch 1. The stream has just started.",
        '[t=1.5s] speech: "a door opens"',
        "[t=2.0s]",
        "<image>",
        "[t=3.0s]",
        "<image>",
        INSTRUCTION,
    ]


def test_answers_are_own_turns_and_the_report_names_the_window() -> None:
    window = DescribeWindow(DescribeSettings())
    window.add_frame(frame(1.0))
    first = window.request(INSTRUCTION)
    window.answer(first.epoch, "A hallway, empty.")
    window.add_frame(frame(2.0))
    second = window.request(INSTRUCTION)
    roles = [m.role for m in second.messages]
    assert roles == ["system", "user", "assistant", "user"]
    assert second.messages[2].parts == (VlmText("A hallway, empty."),)
    assert (second.window_start_pts, second.window_end_pts) == (101.0, 102.0)
    assert second.newest_captured_at == 1_700_000_002.0
    assert second.frames == 2


def test_a_request_with_nothing_new_asks_again_in_a_turn_of_its_own() -> None:
    window = DescribeWindow(DescribeSettings())
    window.add_frame(frame(1.0))
    window.answer(window.request(INSTRUCTION).epoch, "Empty.")
    again = window.request(INSTRUCTION)
    assert [m.role for m in again.messages] == ["system", "user", "assistant", "user"]
    assert again.messages[-1].parts == (VlmText(INSTRUCTION),)


def test_the_frame_budget_rolls_the_epoch_with_the_last_description_as_summary() -> None:
    window = DescribeWindow(DescribeSettings(max_frames=3))
    for t in (1.0, 2.0, 3.0):
        assert not window.full()
        window.add_frame(frame(t))
    request = window.request(INSTRUCTION)
    window.answer(request.epoch, "Two people talk by the door.")
    assert window.full()
    window.roll()
    window.add_frame(frame(4.0))
    rolled = window.request(INSTRUCTION)
    assert rolled.epoch == 2 and rolled.frames == 1
    header = rolled.messages[1].parts[0]
    assert header == VlmText("Epoch 2. Summary of the scene before: Two people talk by the door.")
    assert rolled.window_start_pts == 104.0


def test_the_token_budget_and_the_servers_image_limit_roll_too() -> None:
    settings = DescribeSettings(frame_size=(448, 252), max_prompt_tokens=1000)
    assert image_tokens(settings.frame_size) == 16 * 9 + 2
    window = DescribeWindow(settings)
    frames = 0
    while not window.full(reserve=200):
        window.add_frame(frame(float(frames)))
        frames += 1
    assert 2 <= frames <= 5  # ~150 tokens a frame, the system prompt and 200 reserved
    assert window.tokens + 200 <= 1000
    small = DescribeWindow(DescribeSettings(max_frames=50))
    for t in range(4):
        small.add_frame(frame(float(t)))
    assert not small.full()
    assert small.full(image_limit=4)


def test_a_too_long_window_rolls_keeping_the_newest_frame_and_unsent_speech() -> None:
    window = DescribeWindow(DescribeSettings())
    for t in (1.0, 2.0, 3.0):
        window.add_frame(frame(t))
    window.request(INSTRUCTION)  # refused by the server, say
    window.add_speech(3.5, "help")
    window.roll(keep_newest=True)
    retry = window.request(INSTRUCTION)
    assert retry.epoch == 2 and retry.frames == 1
    texts = [p.text for p in retry.messages[1].parts if isinstance(p, VlmText)]
    assert texts[1:] == ["[t=3.0s]", '[t=3.5s] speech: "help"', INSTRUCTION]
    images = [p for p in retry.messages[1].parts if isinstance(p, VlmImage)]
    assert images == [frame(3.0).image]  # the same bytes: encoded once


def test_a_late_answer_of_the_old_epoch_is_the_new_epochs_summary_until_it_starts() -> None:
    window = DescribeWindow(DescribeSettings())
    window.add_frame(frame(1.0))
    old = window.request(INSTRUCTION)
    window.roll()
    window.answer(old.epoch, "A cat on the sofa.")  # came back after the roll
    window.add_frame(frame(2.0))
    request = window.request(INSTRUCTION)
    assert request.messages[1].parts[0] == VlmText("Epoch 2. Summary of the scene before: A cat on the sofa.")
    window.answer(old.epoch, "too late")  # the header is fixed now: nothing changes
    assert [m.role for m in window.request(INSTRUCTION).messages] == ["system", "user"]


@pytest.mark.parametrize("text", ["", "   "])
def test_empty_speech_is_left_out(text: str) -> None:
    window = DescribeWindow(DescribeSettings())
    window.add_speech(1.0, text)
    assert not window.has_new


def test_speech_waiting_for_a_frame_is_bounded() -> None:
    window = DescribeWindow(DescribeSettings())
    for t in range(100):
        window.add_speech(float(t), f"word {t}")
    window.add_frame(frame(100.0))
    texts = [p.text for p in window.request(INSTRUCTION).messages[1].parts if isinstance(p, VlmText)]
    said = [t for t in texts if "speech:" in t]
    assert len(said) == 32 and said[0] == '[t=68.0s] speech: "word 68"'
