"""Whether a question is about something shared in the chat (a photo, a file, `image#id`)."""

from __future__ import annotations

import re

_ABOUT = re.compile(
    r"\b(image|images|picture|pictures|pic|photo|photos|screenshot|screenshots|scan|scanned|attachment|attachments|"
    r"attached|file|files|document|documents|doc|pdf|pdfs|slide|slides|receipt|invoice|diagram|chart|sent you|"
    r"shared|upload|uploaded|картинк\w*|фото\w*|изображени\w*|скриншот\w*|файл\w*|документ\w*|вложени\w*)\b|"
    r"\[?(image|file)#[0-9a-f]{4,}",
    re.I,
)


def about_attachment(query: str) -> bool:
    """Whether a question is about something shared in the chat (so context adds artifact text)."""
    return bool(_ABOUT.search(query))
