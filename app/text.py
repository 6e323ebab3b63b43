"""Data-derived strings on the page: Markdown-escaped, and chat prompts split into turns.

Streamlit renders `st.markdown`, `st.caption`, expander labels, metric labels and help texts as Markdown, so a run
whose `prompt_id` is `![x](http://host/pixel)` would make every viewer's browser fetch that URL (issue #20.2).
Every string that comes from a run (manifest, sequences, findings) goes through `md` before it reaches one of
those; `st.text`, `st.code`, `st.json` and dataframes show text as is and need nothing.
"""
from __future__ import annotations

import re

_MARKDOWN_SPECIALS = re.compile(r"([\\`*_{}\[\]()<>#+\-.!|~:/$&=\"'])")
"""Characters escaped by `md`; '/' and ':' included so that a bare http:// in data does not become a link either."""


def md(value: object) -> str:
    """`value` as a Markdown-inert string: every Markdown/HTML-special character backslash-escaped, line breaks
    turned into spaces (a caption or label is one line), so it shows literally and can fetch nothing. Streamlit
    still turns a bare "http://…" or "www.…" into a link after escaping: a zero-width space after "http:" and the
    first "w" keeps those plain text (a copied string then carries that invisible character)."""
    text = str(value).replace("\r", " ").replace("\n", " ")
    return _MARKDOWN_SPECIALS.sub(r"\\\1", text).replace("\\:\\/\\/", "\\:\u200b\\/\\/").replace("www", "w\u200bww")


def plain(shown: str) -> str:
    """The text a reader sees for a string `md` escaped (the backslashes removed, a coloured bold word
    `:red[**error**]` as its word): what tests compare against."""
    unwrapped = re.sub(r":[a-z]+\[\*\*(.*?)\*\*\]", r"\1", shown)
    return re.sub(r"\\(.)", r"\1", unwrapped).replace("\u200b", "")


# Chat templates whose markers we can split into turns: (turn pattern with groups role, content).
_TEMPLATES = (
    re.compile(r"<\|im_start\|>(\w+)\n?(.*?)(?:<\|im_end\|>|$)", re.S),                                 # ChatML
    re.compile(r"<\|start_header_id\|>(\w+)<\|end_header_id\|>\n*(.*?)(?:<\|eot_id\|>|$)", re.S),          # Llama 3
    re.compile(r"<start_of_turn>(\w+)\n?(.*?)(?:<end_of_turn>|$)", re.S),                                # Gemma
)


def chat_turns(prompt: str) -> list[tuple[str, str]] | None:
    """(role, content) turns of a prompt rendered with a known chat template (ChatML, Llama 3, Gemma), or None when
    the prompt has no such markers (a plain prompt is shown as is). A trailing empty assistant turn (the generation
    prompt) is kept: it says where the response starts."""
    for pattern in _TEMPLATES:
        turns = [(m.group(1), m.group(2).strip()) for m in pattern.finditer(prompt)]
        if turns:
            return turns
    return None
