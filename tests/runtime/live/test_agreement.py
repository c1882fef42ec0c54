"""Partial transcripts send only what two transcriptions in a row agree on."""

from __future__ import annotations

from modelpool.runtime.live.agreement import LocalAgreement


def test_words_go_out_once_two_partials_agree() -> None:
    agreement = LocalAgreement()
    assert agreement.partial("The quick bro") == ""
    assert agreement.partial("The quick brown fox") == "The quick"
    assert agreement.partial("The quick brown fox jumps") == " brown fox"
    assert agreement.partial("The quick brown fox, jumps over") == " jumps"  # punctuation does not count
    assert agreement.final("The quick brown fox jumps over the lazy dog.") == " over the lazy dog."
    assert agreement.sent == "The quick brown fox jumps over the lazy dog."


def test_nothing_is_taken_back() -> None:
    agreement = LocalAgreement()
    agreement.partial("I scream for")
    assert agreement.partial("I scream for you") == "I scream for"
    assert agreement.partial("Ice cream for you") == ""  # disagrees with what was sent: wait
    assert agreement.partial("Ice cream for you all") == ""
    assert agreement.final("Ice cream for you all.") == ""  # the completed event carries it
