from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.tokenizer.stop import StopStringMatcher


def _run(stops: list[str], pieces: list[str]) -> tuple[str, bool]:
    m, out = StopStringMatcher(stops), ""
    for piece in pieces:
        text, hit = m.feed(piece)
        out += text
        if hit:
            return out, True
    return out + m.flush(), False


def test_stop_split_across_pieces_is_never_emitted() -> None:
    assert _run(["STOP"], ["ab S", "T", "O", "Pxyz"]) == ("ab ", True)
    assert _run(["STOP"], ["ab S", "T", "x"]) == ("ab STx", False)


def test_the_stop_that_ends_first_wins() -> None:
    assert _run(["world", "lo w"], ["hel", "lo world"]) == ("hel", True)
    assert _run(["abcd", "b"], ["xabcd"]) == ("xa", True)


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="abc\n", max_size=40),
    stops=st.lists(st.text(alphabet="abc\n", min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 40), max_size=10),
)
def test_matches_a_plain_search_for_any_split(text: str, stops: list[str], cuts: list[int]) -> None:
    bounds = sorted({0, len(text), *[min(c, len(text)) for c in cuts]})
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    hits = [(i + len(s), i) for s in stops if (i := text.find(s)) >= 0]
    expected = (text[: min(hits)[1]], True) if hits else (text, False)
    assert _run(stops, pieces) == expected
