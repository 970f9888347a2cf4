"""chatmem: conversation memory for chat bots.

One import namespace. The folders at the top of the repository are its subpackages
(`chatmem.schemas` is `schemas/`, `chatmem.memory` is `memory/`, ...; see pyproject.toml), and
`chatmem.bootstrap`, the composition root, sits above them all."""
