"""`radixserve shell` through a pseudo-terminal: two turns with history, /reset, /exit."""
from __future__ import annotations

import os
import re
import sys
import time

import pexpect

TURN = re.compile(rb"\[(\d+) prompt tokens, (\d+) generated, (\w+)\]")


def _spawn_shell(model, max_tokens: int) -> pexpect.spawn:
    env = os.environ | {"TERM": "dumb", "PROMPT_TOOLKIT_NO_CPR": "1", "RADIXSERVE_LOG_LEVEL": "WARNING"}
    return pexpect.spawn(sys.executable, ["-m", "radixserve", "shell", "--model", str(model),
                                          "--device", "cpu", "--max-tokens", str(max_tokens)],
                         env=env, timeout=120)


def _turn(child: pexpect.spawn, text: str) -> tuple[int, int]:
    child.expect("you> ")
    child.sendline(text)
    child.expect(TURN)
    prompt, generated, reason = child.match.groups()
    assert reason in (b"stop", b"length") and 0 < int(generated) <= 6
    return int(prompt), int(generated)


def test_shell_keeps_history_resets_and_exits(tiny_model) -> None:
    child = _spawn_shell(tiny_model, 6)
    try:
        first, _ = _turn(child, "hello there")
        second, _ = _turn(child, "hello there")
        assert second > first + 1, "the second turn's prompt holds the first exchange"
        child.expect("you> ")
        child.sendline("/reset")
        child.expect(re.escape("[history cleared]"))
        third, _ = _turn(child, "hello there")
        assert third == first
        child.expect("you> ")
        child.sendline("/exit")
        child.expect("bye")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


def test_shell_ctrl_c_at_the_prompt_keeps_it_and_ctrl_d_exits(tiny_model) -> None:
    child = _spawn_shell(tiny_model, 4)
    try:
        child.expect("you> ")
        time.sleep(0.5)  # let prompt_toolkit enter raw mode, or the tty eats the control key
        child.sendintr()
        _turn(child, "still here")
        child.expect("you> ")
        time.sleep(0.5)
        child.send("\x04")
        child.expect("bye")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


def test_shell_ctrl_c_cancels_the_reply_not_the_shell(tiny_model) -> None:
    child = _spawn_shell(tiny_model, 1000)
    try:
        child.expect("you> ")
        child.sendline("tell me a long story")
        child.expect("tell me a long story")  # the echo of our line
        child.read_nonblocking(1, timeout=60)  # the reply has started streaming …
        child.sendintr()  # … and is cut long before its ~1000 tokens
        child.expect(TURN)
        _, generated, reason = child.match.groups()
        assert reason == b"cancelled" and int(generated) < 1000
        _turn_any = child.expect("you> ")  # the shell is still there and answers again
        child.sendline("/exit")
        child.expect("bye")
        child.expect(pexpect.EOF)
        assert _turn_any == 0
    finally:
        child.close()
    assert child.exitstatus == 0
