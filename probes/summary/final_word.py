"""The summary's final word on the batch size: the advisor's answer as the job ended
(``summary.md``'s section under the story; the numbers are ``Summary.final_word``)."""

from __future__ import annotations

from .schema import Summary


def final_word_section(s: Summary) -> str:
    """The advisor's answer as the job ended: what, why (the deciding reason first), how sure,
    what would change it, and the answers it gave on the way."""
    word = s.final_word
    if word is None or not word.advice.get("headline"):
        return ""
    advice = word.advice
    reasons = advice.get("reasons") or []
    when = " (its last answer: the job ended without a final word)" if word.ended_without else ""
    lines = [
        f"**{advice['headline']}**{when}, confidence {advice.get('confidence', 'low')}: "
        f"{reasons[0] if reasons else advice.get('why', '')}.",
        "",
        *(f"- {reason}" for reason in reasons[1:]),
    ]
    if advice.get("would_change"):
        lines.append(f"- what would change it: {advice['would_change']}")
    if word.said:
        steps = "; ".join(f"step {note.step:,}: {note.message}" for note in word.said)
        lines += ["", f"How it got there: {steps}."]
    return "## Final word on the batch size\n\n" + "\n".join(lines) + "\n"
